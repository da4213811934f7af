"""Self-check: run a student notebook and say, exercise by exercise, PASS, FAIL or TODO.

    python -m course_tools.student.check notebooks/02_attention/02_attention.ipynb
    python -m course_tools.student.check notebooks/02_attention/02_attention.ipynb --exercise causal_mask
    python -m course_tools.student.check all          # every chapter; or a folder of notebooks

A fresh kernel runs the code cells in order, up to the last graded cell (what follows is not
graded and is skipped); an error does not stop the run. The chapter's own demonstrations, the
code cells it was released with that are neither set-up nor graded (training runs, figures), are
skipped while they are unchanged: no test depends on them (exercises are independent by
design), and they are most of a chapter's time. Every cell you added or changed runs.
``--all-cells`` runs every code cell, as "Restart and run all" would. With ``--exercise NAME``
only the set-up cells and that exercise's two cells run, in seconds. Each
exercise gets PASS, FAIL (the error, the line that failed and, for a bare ``assert``, the values
it compared) or TODO (still ``raise NotImplementedError()``); each written question ANSWERED or
TODO (your instructor grades those by hand). Only the visible tests run here; the grader adds
hidden ones. Each PASS is then checked as the grader runs the answer: the set-up cells, the
answer's cell alone and its tests, in a fresh process where the grader's refusals hold
(:mod:`.guard`); an answer that uses a name only another of your cells defines, or a tool the
grader refuses, FAILs here with the grader's words. The exit status is 0 only if every exercise
passes and every written question is answered.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import json
import logging
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

from course_tools import config, notebook
from course_tools.grading.grader import mistakes, verdicts
from course_tools.grading.sandboxed import guard, work_limit

ANSWER_PLACEHOLDER = "YOUR ANSWER HERE"  # what nbgrader leaves in an unanswered written question
_MARK = "__course_selfcheck__"

# Runs in the student's kernel right after a cell failed: where, in the notebook's own cells, the
# error happened and, for a bare `assert` there, the value of each expression it compared.
_INSPECT = r'''
def _course_selfcheck():
    import ast, json, linecache, sys, traceback
    tb, err = getattr(sys, "last_traceback", None), getattr(sys, "last_value", None)
    def in_a_cell(frame):
        name = frame.f_code.co_filename
        return "ipykernel_" in name or name.startswith("<ipython-input")
    frames = list(traceback.walk_tb(tb))
    cells = [(f, n) for f, n in frames if in_a_cell(f)]
    if not cells:
        return {}
    frame, lineno = cells[-1]
    source = "".join(linecache.getlines(frame.f_code.co_filename))
    lines = source.splitlines()
    line = lines[lineno - 1].strip() if lineno <= len(lines) else ""
    out = {"cell": source, "lineno": lineno, "line": line, "values": []}
    if not isinstance(err, AssertionError) or frames[-1][0] is not frame:
        return out
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return out
    asserts = [n for n in ast.walk(tree) if isinstance(n, ast.Assert) and n.lineno <= lineno <= n.end_lineno]
    if not asserts:
        return out
    node = asserts[-1]
    out["line"] = ast.unparse(node)
    def parts(test):
        if isinstance(test, ast.Compare):
            return [test.left, *test.comparators]
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return parts(test.operand)
        if isinstance(test, ast.BoolOp):
            return [p for v in test.values for p in parts(v)]
        if isinstance(test, ast.Call) and (test.args or test.keywords):
            return [*test.args, *(k.value for k in test.keywords)]
        return [test]
    for part in parts(node.test):
        if isinstance(part, ast.Constant):
            continue
        try:
            code = compile(ast.Expression(part), "<self-check>", "eval")
            value = eval(code, frame.f_globals, frame.f_locals)
            text = " ".join(repr(value).split())
        except Exception as e:
            text = f"(could not evaluate: {type(e).__name__})"
        out["values"].append([ast.unparse(part), text[:300] + (" ..." if len(text) > 300 else "")])
    return out
try:
    print("__course_selfcheck__" + __import__("json").dumps(_course_selfcheck()))
finally:
    del _course_selfcheck
'''


@dataclass(frozen=True)
class Result:
    exercise: str  # an exercise's or a written question's grade_id
    status: str  # "PASS" | "FAIL" | "TODO" for exercises; "ANSWERED" | "TODO" for written questions
    detail: str = ""


def _error_of(cell) -> tuple[str, str] | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return out.get("ename", ""), out.get("evalue", "")
    return None


def _where(client: NotebookClient, index: int) -> dict:
    """Ask the kernel where the last error happened (``_INSPECT``); {} if it cannot say."""
    probe, failed = nbformat.v4.new_code_cell(_INSPECT), client.nb.cells[index]
    try:
        client.execute_cell(probe, index)
    except Exception:  # noqa: BLE001 (a probe that fails only loses the detail)
        return {}
    finally:
        client.nb.cells[index] = failed  # execute_cell stores the probe at that index
    for out in probe.get("outputs", []):
        text = out.get("text", "")
        if out.get("output_type") == "stream" and _MARK in text:
            return json.loads(text.split(_MARK, 1)[1].splitlines()[0])
    return {}


def _failure(error: tuple[str, str], where: dict, cells: dict[str, str]) -> str:
    """``AssertionError: message`` then the failing line, named by its cell, and the values."""
    ename, evalue = error
    lines = [f"{ename}: {evalue}".rstrip(": ").rstrip()]
    if where.get("line"):
        cell = next((name for name, src in cells.items() if src.strip() == where["cell"].strip()), "a cell")
        lines.append(f"{cell}, line {where['lineno']}: {where['line']}")
        lines += [f"  {expr} = {value}" for expr, value in where.get("values", [])]
    return "\n".join(lines)


def _names(source: str) -> tuple[set[str], set[str]]:
    """(names a cell binds anywhere, names it reads) by its syntax; empty for a cell that is not
    plain Python (a magic): the warning below is advice and must never be wrong."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set(), set()
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound, read


def borrowed_names(nb, ex: notebook.Exercise) -> list[str]:
    """Names the answer reads that only another of the notebook's cells defines (not the set-up
    cells, not the answer itself): the grader runs each answer with the set-up cells alone, so
    there they do not exist, though the self-check, which runs the cells in one kernel, passes."""
    setup = {name for i in notebook.setup_cells(nb) for name in _names(nb.cells[i].source)[0]}
    bound, read = _names(nb.cells[ex.solution_cell].source)
    candidates = read - bound - setup - set(dir(builtins))
    elsewhere = {name for i, c in enumerate(nb.cells) if c.cell_type == "code" and i != ex.solution_cell
                 for name in _names(c.source)[0]}
    return sorted(candidates & elsewhere)


def _client(nb, path: Path, timeout: int | None) -> work_limit.WatchedClient:
    """A client whose cells may use ``timeout`` CPU seconds each (:mod:`.work_limit`): a cell
    over it is interrupted and the kernel, with what the earlier cells defined, goes on."""
    quiet = logging.getLogger("course_lib.selfcheck")  # nbclient's own log would print tracebacks
    quiet.setLevel(logging.CRITICAL)
    return work_limit.WatchedClient(nb, timeout or config.cell_timeout(),
                                    interrupt_on_limit=True, kernel_name="python3", allow_errors=True,
                                    interrupt_on_timeout=True, log=quiet,
                                    shutdown_kernel="immediate",  # nothing to save; a graceful stop waits
                                    resources={"metadata": {"path": str(path.parent)}})


def cells_to_run(nb, exercise: str | None = None, all_cells: bool = False,
                 name: str = "the notebook") -> tuple[list[notebook.Exercise], list[int]]:
    """The exercises to report and the indices of the code cells to run, in order."""
    exercises = notebook.exercises(nb)
    if exercise is not None:
        wanted = config.EXERCISE_PREFIX + exercise.removeprefix(config.EXERCISE_PREFIX)
        exercises = [ex for ex in exercises if ex.name == wanted]
        if not exercises:
            names = ", ".join(ex.name.removeprefix(config.EXERCISE_PREFIX) for ex in notebook.exercises(nb))
            raise ValueError(f"{name} has no exercise {exercise!r}; its exercises: {names}")
        ex = exercises[0]
        return exercises, [*notebook.setup_cells(nb), ex.solution_cell, ex.test_cell]
    last = max((ex.test_cell for ex in exercises), default=-1)
    skip = set() if all_cells else notebook.unchanged_demonstrations(nb)
    return exercises, [i for i, c in enumerate(nb.cells[: last + 1])
                       if c.cell_type == "code" and i not in skip]


def check(path: Path, timeout: int | None = None, exercise: str | None = None,
          all_cells: bool = False) -> list[Result]:
    """PASS, FAIL or TODO for each exercise of the notebook at ``path`` (or for ``exercise`` alone).

    Unchanged demonstration cells of the released chapter are skipped unless ``all_cells``."""
    path = Path(path)
    nb = notebook.read(path)
    exercises, order = cells_to_run(nb, exercise, all_cells, name=path.name)
    graded = {i for ex in exercises for i in (ex.solution_cell, ex.test_cell)}
    env = config.kernel_env()
    client = _client(nb, path, timeout)
    stopped: dict[int, str] = {}
    where: dict[int, dict] = {}
    with tempfile.TemporaryFile("w+") as kernel_stderr, \
            client.setup_kernel(env=env, stderr=kernel_stderr):
        for n, index in enumerate(order):
            start = time.monotonic()
            try:
                client.execute_cell(nb.cells[index], index)
            except (CellTimeoutError, CellExecutionError, TimeoutError):
                pass
            except DeadKernelError:  # the remaining cells cannot run
                kernel_stderr.seek(0)
                why = (f"the cell {client.stopped}" if client.stopped
                       else f"the kernel died ({client.death(kernel_stderr.read())})")
                stopped[index] = why
                for later in order[n + 1:]:
                    stopped[later] = f"not run: {why}" if client.stopped else why
                break
            if client.stopped:  # interrupted at its limit of work
                stopped[index] = f"the cell {client.stopped}"
            elif time.monotonic() - start >= client.timeout:  # interrupted (interrupt_on_timeout)
                stopped[index] = f"the cell {client.past_backstop()}"
            elif _error_of(nb.cells[index]) and index in graded:
                where[index] = _where(client, index)
    results = []
    for ex in exercises:
        sol, test = nb.cells[ex.solution_cell], nb.cells[ex.test_cell]
        cells = {"your solution": sol.source, "the test": test.source}
        sol_err, test_err = _error_of(sol), _error_of(test)
        if ex.solution_cell in stopped:
            results.append(Result(ex.name, "FAIL", f"your solution: {stopped[ex.solution_cell]}"))
        elif ex.test_cell in stopped:
            results.append(Result(ex.name, "FAIL", f"the test: {stopped[ex.test_cell]}"))
        elif "NotImplementedError" in (sol_err or ("",))[0] + (test_err or ("",))[0]:
            results.append(Result(ex.name, "TODO", "not answered yet"))
        elif sol_err:
            results.append(Result(ex.name, "FAIL", _failure(sol_err, where.get(ex.solution_cell, {}), cells)))
        elif test_err:
            results.append(Result(ex.name, "FAIL", _failure(test_err, where.get(ex.test_cell, {}), cells)))
        else:
            results.append(Result(ex.name, "PASS"))
    return _named(path, nb, _as_graded(path, nb, results), stopped={
        ex.name for ex in exercises if ex.solution_cell in stopped or ex.test_cell in stopped})


def _as_graded(path: Path, nb, results: list[Result]) -> list[Result]:
    """``results`` with each PASS checked as the grader runs the answer: the set-up cells, the
    answer's cell alone and its tests, in a fresh process under the graded run's guard
    (:mod:`.guard`). What fails there (a name from another cell, a refused tool) is a FAIL with the
    grader's words; a call of course_lib's own reference is a PASS that says it is flagged."""
    passed = {r.exercise for r in results if r.status == "PASS"}
    req = verdicts.request(nb, recording=False)
    req["exercises"] = [ex for ex in req["exercises"] if ex["name"] in passed]
    if not req["exercises"]:
        return results
    req["guard"] = True
    try:
        runs = verdicts.run_elsewhere(req, 60 + 2 * req["timeout"] * len(req["exercises"]),
                                      cwd=str(path.parent))
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        why = str(e).strip().splitlines()[-1][:200] if str(e).strip() else type(e).__name__
        note = f"(not checked as the grader runs it: {why})"
        return [Result(r.exercise, r.status, f"{r.detail} {note}".strip()) if r.status == "PASS" else r
                for r in results]
    exercises = {ex.name: ex for ex in notebook.exercises(nb)}
    out = []
    for r in results:
        run = runs.get(r.exercise) if r.status == "PASS" else None
        if run and run.get("error"):
            why = f"the grader runs this answer with the set-up cells only, and there: {run['error']}"
            if borrowed := borrowed_names(nb, exercises[r.exercise]):
                names = ", ".join(f"`{n}`" for n in borrowed)
                why += f"\nit uses {names} from another cell: define them in the answer's cell"
            r = Result(r.exercise, "FAIL", why)
        elif run and (taken := [e for e in run.get("events", []) if e.endswith(guard.BORROWED)]):
            r = Result(r.exercise, "PASS", f"but your instructor sees that it {taken[0].split(',')[0]}")
        out.append(r)
    return out


def _named(path: Path, nb, results: list[Result], stopped: set[str]) -> list[Result]:
    """``results`` with each FAIL that behaves like a known mistake of the chapter saying so
    (:mod:`.mistakes`): the failing answers recorded by their visible tests, as the grader records
    them, and compared with the mistakes of the key shipped with the course. An exercise stopped
    by a limit is not named; nothing is said where no key or no match is found."""
    chapter = _chapter_of(path, nb)
    shipped = (mistakes.load_visible(chapter).get("exercises") or {}) if chapter else {}
    failed = {r.exercise for r in results if r.status == "FAIL"} & set(shipped) - stopped
    if not failed:
        return results
    req = verdicts.request(nb, recording=True)
    req["exercises"] = [ex for ex in req["exercises"] if ex["name"] in failed]
    limit = 60 + 2 * req["timeout"] * len(req["exercises"])
    try:
        runs = verdicts.run_elsewhere(req, limit, cwd=str(path.parent))
    except (RuntimeError, ValueError, subprocess.TimeoutExpired):
        return results  # the FAILs stand as they are; naming them is a help, not a verdict
    out = []
    for r in results:
        entry, run = shipped.get(r.exercise), runs.get(r.exercise)
        if r.exercise in failed and run and verdicts.judge(entry["key"], run) is not None:
            line = mistakes.hint_line(mistakes.name(entry["key"], entry["mistakes"], run))
            r = Result(r.exercise, r.status, f"{r.detail}\n{line}" if line else r.detail)
        out.append(r)
    return out


def _chapter_of(path: Path, nb) -> str | None:
    """The chapter ``nb`` is a copy of (by the keys shipped with the course): its file's name, else
    the one whose exercises it has."""
    if mistakes.visible_path(path.stem).is_file():
        return path.stem
    names = {ex.name for ex in notebook.exercises(nb)}
    for shipped in sorted(mistakes.KNOWN_DIR.glob("*.json")):
        if names and names <= set(mistakes.load_visible(shipped.stem).get("exercises") or {}):
            return shipped.stem
    return None


def written(path: Path) -> list[Result]:
    """ANSWERED or TODO for each written question (graded by hand) of the notebook at ``path``."""
    nb = notebook.read(path)
    ids = set(notebook.written_questions(nb))
    out = []
    for cell in nb.cells:
        gid = notebook.nbgrader_meta(cell).get("grade_id")
        if gid in ids:
            blank = ANSWER_PLACEHOLDER in cell.source or not cell.source.strip()
            out.append(Result(gid, "TODO" if blank else "ANSWERED", "written, graded by hand"))
    return out


def report(results: list[Result]) -> str:
    """One line per result, the detail's further lines indented under it."""
    width = max((len(r.exercise) for r in results), default=0)
    lines = []
    for r in results:
        first, *rest = r.detail.splitlines() or [""]
        lines.append(f"{r.exercise:<{width}}  {r.status:<8}  {first}".rstrip())
        lines += [" " * (width + 12) + more for more in rest]
    return "\n".join(lines)


def notebooks_to_check(target: str) -> list[Path]:
    """A notebook, every notebook under a folder, or ``all`` (every chapter's student notebook)."""
    if target == "all":
        return [config.student_path(c) for c in config.chapters()]
    path = Path(target)
    if path.is_dir():
        found = sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        if not found:
            raise ValueError(f"no notebooks under {target}")
        return found
    if path.is_file():
        return [path]
    raise ValueError(f"no such notebook or folder: {target}")


USAGE = """Say which notebook to check, for example:

  make check NB=notebooks/02_attention/02_attention.ipynb
  make check NB=notebooks/02_attention/02_attention.ipynb EX=causal_mask   (one exercise, in seconds)
  make check NB=all                                                         (every chapter)
  make check NB=notebooks/02_attention/02_attention.ipynb ALL_CELLS=1       (the demonstrations too)

or directly: python -m course_tools.student.check NOTEBOOK|FOLDER|all [--exercise NAME] [--all-cells]"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", nargs="?", help="a notebook, a folder of notebooks, or 'all'")
    parser.add_argument("--exercise", help="check this exercise alone (name with or without 'ex_')")
    parser.add_argument("--all-cells", action="store_true",
                        help="also run the chapter's unchanged demonstration cells (training runs, figures)")
    parser.add_argument("--timeout", type=int, default=None, help="seconds per cell (default: the book's)")
    args = parser.parse_args(argv)
    if not args.target:
        print(USAGE)
        return 2
    try:
        paths = notebooks_to_check(args.target)
        if args.exercise and len(paths) != 1:
            raise ValueError("--exercise needs one notebook, not a folder or 'all'")
        ok = True
        for n, path in enumerate(paths, 1):
            if len(paths) > 1:  # before the check: a whole chapter takes seconds
                print(f"\n[{n}/{len(paths)}] {path}", flush=True)
            results = check(path, args.timeout, args.exercise, args.all_cells)
            questions = [] if args.exercise else written(path)
            print(report(results + questions))
            passed = sum(r.status == "PASS" for r in results)
            todo = sum(r.status == "TODO" for r in questions)
            line = f"Self-check: {passed} of {len(results)} exercises pass"
            if questions:
                line += (f"; {todo} of {len(questions)} written questions still TODO" if todo
                         else f"; all {len(questions)} written questions answered")
            print(line + ".")
            ok &= passed == len(results) and not todo
    except ValueError as e:
        print(f"self-check: {e}", file=sys.stderr)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
