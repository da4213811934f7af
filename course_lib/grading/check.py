"""Self-check: run a student notebook and say, exercise by exercise, pass or fail.

    python -m course_lib.grading.check notebooks/01_tokenization/01_tokenization.ipynb

Every cell runs in order in a fresh kernel, as "Restart and run all" would, but an error does
not stop the run: each exercise is reported by name with PASS, FAIL (the failing assert or
error) or TODO (still ``raise NotImplementedError()``). The exit status is 0 only if all pass.
Only the visible tests run here; the autograder adds hidden ones.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

from . import config, notebook


@dataclass(frozen=True)
class Result:
    exercise: str
    status: str  # "PASS" | "FAIL" | "TODO"
    detail: str = ""


def _error_of(cell) -> tuple[str, str] | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return out.get("ename", ""), out.get("evalue", "")
    return None


def check(path: Path, timeout: int | None = None) -> list[Result]:
    path = Path(path)
    nb = notebook.read(path)
    exercises = notebook.exercises(nb)
    client = NotebookClient(
        nb,
        timeout=timeout or config.cell_timeout(),
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(path.parent)}},
    )
    stopped = set()
    with client.setup_kernel(env=config.kernel_env()):
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            try:
                client.execute_cell(cell, index)
            except (CellTimeoutError, CellExecutionError, TimeoutError):
                stopped.add(index)
            except DeadKernelError:  # the kernel died: the remaining cells cannot run
                stopped.update(range(index, len(nb.cells)))
                break
    results = []
    for ex in exercises:
        sol_err = _error_of(nb.cells[ex.solution_cell])
        test_err = _error_of(nb.cells[ex.test_cell])
        if ex.solution_cell in stopped or ex.test_cell in stopped:
            results.append(Result(ex.name, "FAIL", f"a cell ran over {client.timeout} s or the kernel died"))
        elif "NotImplementedError" in (sol_err or ("",))[0] + (test_err or ("",))[0]:
            results.append(Result(ex.name, "TODO", "not answered yet"))
        elif sol_err:
            results.append(Result(ex.name, "FAIL", f"solution cell: {sol_err[0]}: {sol_err[1]}"))
        elif test_err:
            results.append(Result(ex.name, "FAIL", f"{test_err[0]}: {test_err[1]}".strip()))
        else:
            results.append(Result(ex.name, "PASS"))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebook", type=Path)
    args = parser.parse_args(argv)
    if not args.notebook.is_file():
        parser.error(f"no such notebook: {args.notebook}")
    results = check(args.notebook)
    width = max((len(r.exercise) for r in results), default=0)
    for r in results:
        print(f"{r.exercise:<{width}}  {r.status}" + (f"  {r.detail}" if r.detail else ""))
    passed = sum(r.status == "PASS" for r in results)
    print(f"Self-check: {passed} of {len(results)} exercises pass.")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
