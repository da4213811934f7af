"""Mutation testing of the graders: plausible wrong answers must fail their exercise's tests.

A chapter's catalogue, ``tests/mutants/NN_name.yaml``, lists entries
``{grade_id: ex_<name>, find: ..., replace: ..., why: ...}``: the wrong answer is the solution
cell of that exercise with ``find`` replaced by ``replace``. Grading runs in one worker process
per chapter, without a kernel per mutant: the set-up cells run once, then for each mutant the
mutated solution and the exercise's full tests (hidden ones included) run in a copy of the
set-up namespace, with a time limit. A mutant is *killed* if anything raises.

    python -m course_lib.grading.mutants 01_tokenization     # prints each verdict, exit 1 if < 90%
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from . import config, notebook

KILL_RATE_TARGET = 0.9
MIN_PER_EXERCISE = 10  # plausible wrong answers per exercise


@dataclass(frozen=True)
class Verdict:
    grade_id: str
    why: str
    killed: bool
    detail: str


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _run(code: str, namespace: dict, seconds: int) -> str:
    """Exec ``code``; returns '' on success or the error's name and message."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        exec(compile(code, "<exercise>", "exec"), namespace)
        return ""
    except _Timeout:
        return f"timed out after {seconds} s"
    except BaseException as e:  # noqa: BLE001 (a wrong answer may raise anything, SystemExit too)
        return f"{type(e).__name__}: {e}"[:200]
    finally:
        signal.alarm(0)


def catalogue_path(chapter: str) -> Path:
    return config.root() / "tests" / "mutants" / f"{chapter}.yaml"


def grade_in_process(chapter: str) -> list[Verdict]:
    """Grade every mutant of ``chapter`` in this process (the worker's body)."""
    import matplotlib

    matplotlib.use("Agg")
    import yaml

    nb = notebook.read(config.solution_path(chapter))
    exercises = {ex.name: ex for ex in notebook.exercises(nb)}
    timeout = config.cell_timeout()
    base: dict = {"__name__": "__main__"}
    for i in notebook.setup_cells(nb):
        error = _run(nb.cells[i].source, base, timeout)
        if error:
            raise RuntimeError(f"set-up cell {i} of {chapter} failed: {error}")
    verdicts = []
    # The unmutated answers must pass, or no verdict would mean anything.
    for name, ex in exercises.items():
        answer = nb.cells[ex.solution_cell].source + "\n" + nb.cells[ex.test_cell].source
        error = _run(answer, dict(base), timeout)
        if error:
            raise RuntimeError(f"the solution of {name} fails its own tests: {error}")
    for m in yaml.safe_load(catalogue_path(chapter).read_text(encoding="utf-8")):
        ex = exercises.get(m["grade_id"])
        if ex is None:
            raise ValueError(f"mutant for unknown exercise {m['grade_id']!r} in {chapter}")
        solution = nb.cells[ex.solution_cell].source
        if m["find"] not in solution:
            raise ValueError(f"mutant {m['why']!r}: {m['find']!r} is not in {ex.name}'s solution")
        mutated = solution.replace(m["find"], m["replace"], 1)
        error = _run(mutated + "\n" + nb.cells[ex.test_cell].source, dict(base), timeout)
        verdicts.append(Verdict(ex.name, m["why"], bool(error), error))
    return verdicts


def grade(chapter: str) -> list[Verdict]:
    """Grade every mutant of ``chapter`` in a fresh worker process."""
    proc = subprocess.run(
        [sys.executable, "-m", "course_lib.grading.mutants", chapter, "--json"],
        capture_output=True, text=True, cwd=config.solution_path(chapter).parent,
    )
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"mutant worker for {chapter} failed:\n{proc.stderr[-3000:]}")
    return [Verdict(**v) for v in json.loads(proc.stdout.strip().splitlines()[-1])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Grade a chapter's mutant catalogue.")
    parser.add_argument("chapter")
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    args = parser.parse_args(argv)
    verdicts = grade_in_process(args.chapter)
    rate = sum(v.killed for v in verdicts) / max(len(verdicts), 1)
    if args.json:
        print(json.dumps([asdict(v) for v in verdicts]))
    else:
        for v in verdicts:
            print(f"{'killed ' if v.killed else 'SURVIVED'} {v.grade_id}: {v.why}")
        print(f"Kill rate: {rate:.0%} of {len(verdicts)} mutants (target {KILL_RATE_TARGET:.0%}).")
    return 0 if rate >= KILL_RATE_TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
