"""Verdicts decided where no student code ever ran: graded runs record data, the grader judges it.

Runs in the grader's own process (and the self-check's); student code never runs here. An
exercise's test cell runs twice, in two processes that never meet:

1. **The graded run**, in the sandbox (:mod:`course_tools.grading.sandboxed.graded_run`): the
   answer, then the test code as :func:`answer_side` makes it, with every reference left out
   (the ``expected`` argument of each check is removed and the reference side of gradient checks
   is not run; the cell's top-level names are local to one function). Each check records what
   the answer gave, as plain data.
2. **The answer key** (:func:`answer_key`), made once per chapter outside the sandbox from the
   instructor's solution notebook: the same test code (:func:`key_side`) on the solution, with
   each reference computed, records each check's ``expected`` value and parameters (tolerance,
   dtype...). The solution must pass its own key.

:func:`judge` then applies :data:`course_tools.student.judges.JUDGES` to each pair of recorded
values: the verdict of an exercise is "passed" only if every check of the key is matched, in
order, by a check of the record that passes, and the graded run ended without an error. A
missing, late, malformed or shorter record fails. A forged record can only claim outputs, which
must then equal the instructor's within the tolerance: the claim of a correct answer.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from course_tools import config, notebook
from course_tools.grading.sandboxed.graded_run import CHECKS_NAME, key_types

# check -> index of the reference
CHECKED_CALLS = {"assert_close": 1, "assert_equal": 1, "assert_grads_close": 1}
TEST_FUNCTION = "__graded_tests"


class NoAnswerKey(RuntimeError):
    """The instructor's solution does not pass its own tests: no key can be made."""


# --- the test code of a graded run ------------------------------------------------------------

class _Asserts(ast.NodeTransformer):
    """``assert cond, msg`` -> a recorded check (``checks.assert_true``), so that its outcome is
    judged by the grader like any other check instead of stopping the graded run."""

    def visit_Assert(self, node: ast.Assert):
        message = node.msg or ast.Constant(f"this check failed: {ast.unparse(node.test)[:200]}")
        call = ast.Call(func=ast.Attribute(ast.Name(CHECKS_NAME, ast.Load()), "assert_true", ast.Load()),
                        args=[node.test, ast.Lambda(_no_arguments(), message)], keywords=[])
        return ast.copy_location(ast.Expr(call), node)


def _no_arguments() -> ast.arguments:
    return ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])


def key_side(tests: str) -> str:
    """The test code as the answer key runs it: as the graded run does (see :func:`answer_side`), but
    with each check's reference computed, through ``checks._reference``."""
    return _transform(tests, recording=False)


def answer_side(tests: str) -> str:
    """The test code as the graded run executes it: ``assert`` statements as checks, each check's
    reference argument removed (so no expected value exists in the sandbox), the helpers only the
    references used removed with them, and the top-level code
    made local to one function (so that nothing the tests compute is a global an answer could read).

    >>> print(answer_side("x = f(1)\\nchecks.assert_close(x, ref(1), 'f(1)')"))
    def __graded_tests():
        x = f(1)
        checks.assert_close(x, None, 'f(1)')
    __graded_tests()
    """
    return _transform(tests, recording=True)


@functools.lru_cache(maxsize=512)  # a grading process transforms the same tests for every student
def _transform(tests: str, recording: bool) -> str:
    tree = _Asserts().visit(ast.parse(tests))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Global, ast.Nonlocal)) or (
                isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)):
            raise ValueError("test cells may not use global, nonlocal or import *")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in CHECKED_CALLS and isinstance(node.func.value, ast.Name) and \
                node.func.value.id == "checks":
            index = CHECKED_CALLS[node.func.attr]
            places = [(node.args, index)] if len(node.args) > index else []
            places += [(kw, "value") for kw in node.keywords if kw.arg in ("expected", "reference")]
            for owner, slot in places:
                value = owner[slot] if isinstance(owner, list) else owner.value
                new = ast.Constant(None) if recording else ast.Call(
                    func=ast.Attribute(ast.Name(CHECKS_NAME, ast.Load()), "_reference", ast.Load()),
                    args=[ast.Lambda(_no_arguments(), value)], keywords=[])
                if isinstance(owner, list):
                    owner[slot] = new
                else:
                    owner.value = new
    body = _without_unused_definitions(tree.body) if recording else tree.body
    wrapped = ast.Module(body=[
        ast.FunctionDef(name=TEST_FUNCTION, args=_no_arguments(), body=body or [ast.Pass()],
                        decorator_list=[], returns=None, type_comment=None),
        ast.Expr(ast.Call(func=ast.Name(TEST_FUNCTION, ast.Load()), args=[], keywords=[]))], type_ignores=[])
    return ast.unparse(ast.fix_missing_locations(wrapped))


def _without_unused_definitions(body: list[ast.stmt]) -> list[ast.stmt]:
    """``body`` without the functions and classes that nothing in it uses: once the references are
    removed, the test cell's reference helpers (``_causal_ref``...), so that no reference side of
    a check is in the graded run at all. A definition that only uses itself is kept (rare, safe)."""
    while True:
        used = {node.id for stmt in body for node in ast.walk(stmt)
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
        kept = [stmt for stmt in body if not (
            isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and stmt.name not in used)]
        if len(kept) == len(body):
            return kept
        body = kept


def answer_names(solution_source: str) -> list[str]:
    """The names an exercise's solution cell defines at top level: what its tests may call."""
    try:
        tree = ast.parse(notebook.python_source(solution_source))
    except SyntaxError:
        return []
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def request(nb, answers: dict[str, str] | None = None, recording: bool = True) -> dict:
    """What a runner needs for the chapter notebook ``nb`` (the instructor's): its set-up cells and,
    per exercise, the answer (``answers[grade_id]``, else the solution cell), the test cell and the
    names the tests take from the answer."""
    exercises = []
    for ex in notebook.exercises(nb):
        solution = nb.cells[ex.solution_cell].source
        tests = nb.cells[ex.test_cell].source
        exercises.append({"name": ex.name, "names": answer_names(solution),
                          "answer": solution if answers is None else answers.get(ex.name, ""),
                          "tests": answer_side(tests) if recording else key_side(tests)})
    return {"recording": recording, "timeout": config.cell_timeout(),
            "setup": [nb.cells[i].source for i in notebook.setup_cells(nb)[1:]], "exercises": exercises}


def params_from_data(data: dict) -> dict:
    """A key's check parameters (``tolerance``, ``types``...) back from their recorded form."""
    from course_tools.grading.grader import unwire

    out = {}
    for name, value in data.items():
        if name == "types" and isinstance(value, dict) and "types" in value:
            found = tuple(key_types()[n] for n in value["types"])
            out[name] = found[0] if len(found) == 1 else found
        else:
            out[name] = unwire.decode(value)
    return out


# --- the key and the judge ------------------------------------------------------------------------

def run_elsewhere(req: dict, timeout: float, cwd: str | None = None) -> dict:
    """:func:`.graded_run.run` in a runner process of its own, not sandboxed (the answer key, the
    self-test).

    Its caches go to a folder of its own, removed after: importing torch._dynamo (a dispatch mode
    does) makes ``/tmp/torchinductor_<user>``, and grading leaves nothing behind in a shared /tmp."""
    cmd = [sys.executable, "-m", "course_tools.grading.sandboxed.graded_run", "run"]
    with tempfile.TemporaryDirectory(prefix="course-runner-") as caches:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": caches, "TRITON_CACHE_DIR": caches}
        proc = subprocess.run(cmd, input=json.dumps(req), capture_output=True, text=True, timeout=timeout,
                              cwd=cwd, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"the grading runner failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def _fingerprint(req: dict) -> str:
    h = hashlib.sha256(json.dumps(req, sort_keys=True).encode())
    root = Path(__file__).resolve().parents[3]  # the references are course_lib's, the checks course_tools'
    for path in sorted([*(root / "course_lib").rglob("*.py"), *(root / "course_tools").rglob("*.py")]):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def answer_key(chapter: str, cache_dir: Path | None = None) -> dict:
    """The answer key of ``chapter`` (``{grade_id: checks}``), made from the instructor's notebook in
    a process of its own and kept in ``cache_dir`` (made again when the notebook or course_lib
    changes)."""
    req = request(notebook.read(config.solution_path(chapter)), recording=False)
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"{chapter}-{_fingerprint(req)}.json"
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))
    results = run_elsewhere(req,
                              timeout=60 + 2 * req["timeout"] * len(req["exercises"]),
                              cwd=str(config.solution_path(chapter).parent))
    broken = {name: r["error"] for name, r in results.items() if r.get("error")}
    if broken:
        raise NoAnswerKey(f"the solution of {chapter} fails its own tests, "
                          f"so no answer key can be made: {broken}")
    key = {name: r["checks"] for name, r in results.items()}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(key), encoding="utf-8")
        tmp.replace(path)
    return key


def judge(key: list[dict], result) -> str | None:
    """None if the recorded ``result`` of one exercise passes every check of its ``key``, else why
    not, in words for the student."""
    from course_tools.grading.grader import unwire
    from course_tools.student import judges

    if not isinstance(result, dict) or not isinstance(result.get("checks"), list):
        return "no result came back from the tests"
    record, error = result["checks"], result.get("error")
    if error is not None and not isinstance(error, str):
        return "the tests' result was malformed"
    for i, want in enumerate(key):
        if i >= len(record):
            return f"the tests stopped: {error}" if error else (
                f"the tests stopped before this check: {want['what']}")
        got = record[i]
        if not isinstance(got, dict) or got.get("kind") != want["kind"] or "actual" not in got:
            if error:  # what the answer raised sent the tests elsewhere (a check's block left early)
                return f"the tests stopped: {error}"
            return f"the tests took another path with this answer, at: {want['what']}"
        try:
            actual = unwire.decode(got["actual"])
        except unwire.WireError as e:
            return f"{want['what']}: the answer's value could not be read ({e})"
        # an observation that failed is described by the graded run (what it saw), others by the key
        what = str(got.get("what"))[:1000] if want["kind"] == "true" and got.get("what") else want["what"]
        try:
            judges.JUDGES[want["kind"]](actual, unwire.decode(want["expected"]), what,
                                        **params_from_data(want["params"]))
        except AssertionError as e:
            return str(e)
        except Exception as e:  # noqa: BLE001 (a value of the wrong kind fails its check)
            return f"{want['what']}: {type(e).__name__}: {str(e)[:300]}"
    if error:
        return f"the tests stopped: {error}"
    if len(record) != len(key):
        return "the tests took another path with this answer (more checks than the tests have)"
    return None
