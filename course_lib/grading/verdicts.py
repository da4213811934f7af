"""Verdicts decided where no student code ever ran: graded runs record data, the grader judges it.

An exercise's test cell runs twice, in two processes that never meet:

1. **The graded run**, in the sandbox (``sandbox.py``), one fresh process per exercise forked from a
   runner that has only imported the libraries: the chapter's set-up cells, then the student's
   answer cell for that exercise and nothing else the student wrote, then the test code. The test
   code runs in its own namespace with every reference left out (the ``expected`` argument of
   each check is removed and the reference side of gradient checks is not run; the cell's
   top-level names are local to one function), and each check of :mod:`checks` only *records*
   what the answer gave: values, as plain data (:mod:`wire`), and the observations a check makes
   while the answer runs (inputs changed in place, the error raised, gradients). The record goes
   back through the runner's pipe. Nothing the run prints or publishes is read. The runner is
   the sandbox's init and non-dumpable (:mod:`harden`): no answer writes its output, reads its
   memory or stops it, and it takes each exercise's record only from that exercise's pipe.
2. **The answer key**, made once per chapter outside the sandbox from the instructor's solution
   notebook: the same test code on the solution, with each reference computed, records each
   check's ``expected`` value and parameters (tolerance, dtype...). The solution must pass its own
   key.

The grader then applies :data:`checks.JUDGES` to each pair of recorded values, in its own
process: the verdict of an exercise is "passed" only if every check of the key is matched, in
order, by a check of the record that passes, and the graded run ended without an error. A
missing, late, malformed or shorter record fails. A forged record can only claim outputs, which
must then equal the instructor's within the tolerance: the claim of a correct answer.

While the answer and the tests run, an audit hook refuses the interpreter's introspection to code
that is not the course's or a library's (frames, ``gc``'s object graph, code and function objects
made at run time, ``ctypes``' symbols, raw memory (``/proc/PID/mem``, from any caller),
trace and audit hooks, threads, signal
handlers, new processes, modules imported again after removal) and reports each use, and every
``exec``, ``eval`` or ``compile`` of a string, to the runner as it happens, so that a first use is
on record before it could try to silence the hook. The reports become flags for a person.

    python -m course_lib.grading.verdicts run < request.json   # the runner (used by sandbox.py)
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib
import json
import linecache
import os
import re
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import config, guard, harden, notebook, work_limit

MAX_RECORD_BYTES = 64 * 2**20  # one exercise's record, as sent
SETUP_S = 15  # beyond the cell limit, for a graded run's set-up cells and answer
# check -> index of the reference
CHECKED_CALLS = {"assert_close": 1, "assert_equal": 1, "assert_grads_close": 1}
TEST_FUNCTION = "__graded_tests"


class NoAnswerKey(RuntimeError):
    """The instructor's solution does not pass its own tests: no key can be made."""


# --- what the checks report to ---------------------------------------------------------------

class Session:
    """Collects the checks of one test cell: the answer's side (``recording``) or the key's."""

    def __init__(self, recording: bool):
        self.recording = recording
        self.entries: list[dict] = []
        self.quiet = 0  # > 0 while a reference is computed (checks._reference)

    def check(self, kind: str, what: str, actual, expected, params: dict) -> None:
        from . import checks, wire

        entry = {"kind": kind, "what": str(what)[:1000]}
        if self.quiet:
            checks.JUDGES[kind](actual, expected, what, **params)
            return
        if self.recording:
            entry["actual"] = wire.encode(actual)
        else:
            checks.JUDGES[kind](actual, expected, what, **params)  # the solution passes its own key
            entry["expected"] = wire.encode(expected)
            entry["params"] = _params_data(params)
        self.entries.append(entry)


def _params_data(params: dict) -> dict:
    from . import wire

    out = {}
    for name, value in params.items():
        if name == "types" and value is not None:
            classes = value if isinstance(value, tuple) else (value,)
            out[name] = {"types": [_type_name(c) for c in classes]}
        else:
            out[name] = wire.encode(value)
    return out


def _types() -> dict[str, type]:
    """The types a key may ask an answer to have (``types=`` of a check), by name."""
    import numpy as np
    import torch

    return {"torch.Tensor": torch.Tensor, "int": int, "float": float, "bool": bool, "list": list,
            "tuple": tuple, "str": str, "dict": dict, "numpy.ndarray": np.ndarray}


def _type_name(cls: type) -> str:
    for name, known in _types().items():
        if cls is known:
            return name
    raise NoAnswerKey(f"a check asks for type {cls!r}, which a key cannot hold")


def _params_from_data(data: dict) -> dict:
    from . import wire

    out = {}
    for name, value in data.items():
        if name == "types" and isinstance(value, dict) and "types" in value:
            found = tuple(_types()[n] for n in value["types"])
            out[name] = found[0] if len(found) == 1 else found
        else:
            out[name] = wire.decode(value)
    return out


# --- the test code of a graded run ------------------------------------------------------------

CHECKS_NAME = "_graded_checks_"  # how transformed test code reaches the checks module


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


# --- the runner ---------------------------------------------------------------------------------

def run(req: dict, deadline_s: float | None = None) -> dict:
    """Each exercise of ``req`` in a fresh child process (all in one child with ``req["batch"]``, for
    the graders' self-test); returns ``{name: result}`` where a result has ``checks`` (the session's
    entries), ``error`` (what stopped the tests, or None) and ``events`` (introspection refused or
    flagged while the answer ran)."""
    import matplotlib

    matplotlib.use("Agg")
    import numpy  # noqa: F401  (imported once here, before any fork)
    import torch  # noqa: F401

    from . import checks  # noqa: F401

    guard.import_course_lib()  # every reference exists before an answer could import it
    for name in setup_imports(req["setup"]):  # the set-up cells then find them loaded, in every child
        with contextlib.suppress(Exception):  # a child's set-up reports the failure as its own
            importlib.import_module(name)
    deadline = time.monotonic() + (deadline_s or 10**9)
    exercises = req["exercises"]
    groups = [exercises] if req.get("batch") else [[ex] for ex in exercises]
    results = {}
    for group in groups:
        left = deadline - time.monotonic()
        if left < 1:
            results |= {ex["name"]: {"checks": [], "events": [],
                                     "error": "not run: the notebook's time limit was reached"}
                        for ex in group}
            continue
        # the cell's limit for the tests, and some seconds for the set-up cells and the answer
        results |= _fork(req, group, min((req["timeout"] + SETUP_S) * len(group), left))
    return results


def setup_imports(setup: list[str]) -> list[str]:
    """The modules the set-up cells import (``import a.b``, ``from a import b``: ``a.b`` and ``a``,
    which may be a module or a name), read from their syntax: the instructor's code, imported by
    the runner before it forks, so that no exercise's process pays for them again. Running no
    statement but the imports keeps each child's set-up its own (seeds, settings)."""
    names = []
    for source in setup:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return [n for n in dict.fromkeys(names) if n.split(".")[-1] != "*"]


def _fork(req: dict, group: list[dict], timeout: float) -> dict:
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(out_r)
        code = 1
        try:
            _child(req, group, out_w)
            code = 0
        finally:
            os._exit(code)
    os.close(out_w)
    chunks, size, over = [], 0, False
    # ``timeout`` CPU seconds of the child's process tree (what load does not change), and a wall
    # clock BACKSTOP times longer for a child that only waits
    end = time.monotonic() + timeout * work_limit.BACKSTOP
    with os.fdopen(out_r, "rb", buffering=0) as pipe:
        while time.monotonic() < end and size <= MAX_RECORD_BYTES * len(group):
            ready, _, _ = select.select([pipe], [], [], min(0.25, max(0.0, end - time.monotonic())))
            if not ready:
                over = work_limit.tree_cpu_seconds(pid) > timeout
                if over:
                    break
                continue
            chunk = pipe.read(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    _end_orphans()
    names = [ex["name"] for ex in group]
    events: dict[str, list[str]] = {name: [] for name in names}
    results = {}
    for line in b"".join(chunks).split(b"\n"):
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if not isinstance(message, dict) or message.get("name") not in events:
            continue
        if "event" in message and len(events[message["name"]]) < 100:
            events[message["name"]].append(str(message["event"])[:200])
        elif isinstance(message.get("result"), dict):
            results[message["name"]] = message["result"]
    if size > MAX_RECORD_BYTES * len(group):
        why = "the answer's results were too large to send"
    elif over:
        why = f"it ran past its limit of {timeout:.0f} CPU seconds and was stopped"
    elif os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL and time.monotonic() >= end:
        why = f"it ran past the wall-clock limit of {timeout * work_limit.BACKSTOP:.0f} s and was stopped"
    elif os.WIFSIGNALED(status):
        why = f"its process was killed (signal {os.WTERMSIG(status)}; see the limits)"
    else:
        why = "its process ended before the tests finished"
    for name in names:
        result = results.get(name) or {"checks": [], "error": f"no result came back from the tests: {why}"}
        result["events"] = events[name]
        results[name] = result
    return results


def _end_orphans() -> None:
    """As the sandbox's init, end and reap every process an answer's process left behind (they are
    the init's children now), so that the next exercise starts alone. kill(-1) from a namespace's
    init reaches every process of the namespace but the init."""
    if os.getpid() != 1:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        while True:
            os.waitpid(-1, 0)


def _send(fd: int, message: dict) -> None:
    data = (json.dumps(message, allow_nan=False) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _child(req: dict, group: list[dict], fd: int) -> None:
    """Set-up, then each answer of ``group`` with its tests; each record goes to ``fd`` as it is
    made. Student code runs only here."""
    import random

    import numpy as np
    import torch

    from . import checks

    devnull = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):  # what the answer prints goes nowhere: nothing it writes is read
        os.dup2(devnull, std)
    token = secrets.token_hex(8)
    setup_file, test_file, answer_file = f"<setup {token}>", f"<tests {token}>", "<answer>"
    setup, recording = req["setup"], req["recording"]
    guarded = req.get("guard", recording)  # the self-check guards its runs too, with references
    req.clear()  # the other exercises' tests stay out of reach
    ns: dict = {"__name__": "__main__"}
    for source in setup:
        exec(compile(source, setup_file, "exec"), ns)
    current = [""]  # the exercise whose answer runs, for the reports
    if guarded:
        observed = [f for ex in group for f in guard.references(ex["name"])]
        guard.observe(observed)
        guard.install(fd, (setup_file, test_file), current, (answer_file,), observed)
    while group:
        ex = group.pop(0)
        current[0] = ex["name"]
        session = checks._session = Session(recording=recording)
        error = None
        try:
            for seed in (torch.manual_seed, random.seed, np.random.seed):
                seed(0)
            answer_ns = dict(ns)
            answer = notebook.python_source(ex.pop("answer"))
            # inspect
            linecache.cache[answer_file] = (len(answer), None, answer.splitlines(True), answer_file)
            answer_ns |= {"get_ipython": lambda ns=answer_ns: _Shell(ns), "display": lambda *a, **k: None}
            released = _library_state()
            exec(compile(answer, answer_file, "exec"), answer_ns)
            for changed in _restore(released):  # the tests use the libraries as released
                sys.audit("course.library_changed", changed)
            tests_ns = dict(ns, **{CHECKS_NAME: checks})
            for name in ex["names"]:
                if name in answer_ns:
                    tests_ns[name] = answer_ns[name]
                    if guarded and _is_one_of(answer_ns[name], observed):  # the reference, renamed
                        sys.audit("course.reference_given",
                                  f"{_qualname(answer_ns[name])} (as the answer's {name})")
            for seed in (torch.manual_seed, random.seed, np.random.seed):
                seed(0)
            exec(compile(ex.pop("tests"), test_file, "exec"), tests_ns)
        except BaseException as e:  # noqa: BLE001 (whatever stopped the tests is reported, as text)
            error = _describe(e, answer_file)
        checks._session = None
        _send(fd, {"name": ex["name"], "result": {"checks": session.entries, "error": error}})


LIBRARIES = ("course_lib", "torch", "torch.nn.functional", "torch.testing", "numpy", "math", "builtins")


def _library_state() -> dict[str, dict]:
    """The attributes of the modules the tests use: course_lib's (its checks, its helpers) and
    the libraries the tests compute with."""
    return {name: dict(vars(module)) for name, module in list(sys.modules.items())
            if module is not None and (name in LIBRARIES or name.startswith("course_lib."))}


def _restore(state: dict[str, dict]) -> list[str]:
    """Put back every function, class or module of a library module that an answer's cell replaced
    or removed since ``state`` (``attention.watch_tensors = ...``, ``setattr(checks, name, ...)``,
    however spelled), so that its tests run with the libraries as released; returns what was
    changed, for the reports. Names added, and data a module sets for itself (a cache filled
    lazily), are left alone."""
    changed = []
    for name, attributes in state.items():
        now = vars(sys.modules[name]) if name in sys.modules else {}
        for attr, value in attributes.items():
            if now.get(attr, _MISSING) is not value and (callable(value) or isinstance(value, type(sys))):
                changed.append(f"{name}.{attr}")
                now[attr] = value
    return changed


_MISSING = object()


def _layers(value) -> list:
    """``value`` and what it wraps, a few layers deep: a ``functools.partial``'s ``func``, a
    decorator's ``__wrapped__``."""
    out = []
    while value is not None and len(out) < 8:
        out.append(value)
        value = getattr(value, "func", None) or getattr(value, "__wrapped__", None)
    return out


def _is_one_of(value, functions) -> bool:
    """Whether ``value`` is one of ``functions``, or a partial or wrapper of one."""
    return any(layer is f for layer in _layers(value) for f in functions)


def _qualname(value) -> str:
    named = [layer for layer in _layers(value) if hasattr(layer, "__qualname__")]
    return f"{named[0].__module__}.{named[0].__qualname__}" if named else "a reference"


class _Shell:
    """What ``get_ipython()`` gives an answer in a graded run: the timing magics run their code once
    (their timing is of no use to a grade); any other magic fails and says so, here and in the
    self-check alike."""

    TIMING = ("time", "timeit")

    def __init__(self, ns: dict):
        self.ns = ns

    def run_line_magic(self, name: str, line: str, _stack_depth=1):
        return self.run_cell_magic(name, line, "")

    def run_cell_magic(self, name: str, line: str, cell: str):
        if name not in self.TIMING:
            raise RuntimeError(f"the IPython magic %{name} is not run by the grader: move it to a cell of "
                               "your own, outside the answer's cell")
        if name == "timeit":  # options first: -n 10 -r 3 -q -o
            cell = cell or re.sub(r"^\s*(-[a-z]\s*(\d+\s*)?)*", "", line)
        else:
            cell = cell or line
        exec(compile(cell, "<answer>", "exec"), self.ns)

    def __getattr__(self, name):
        raise AttributeError(f"get_ipython().{name} is not available while an answer is graded")


def _describe(e: BaseException, answer_file: str) -> str:
    """``Type: message``, and the line of the answer where it was raised, if it was."""
    import traceback

    text = f"{type(e).__name__}: {e}"[:600]
    lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == answer_file]
    return text + (f" (raised at line {lines[-1]} of the answer)" if lines else "")


# --- the key and the judge ------------------------------------------------------------------------

def run_elsewhere(req: dict, timeout: float, cwd: str | None = None) -> dict:
    """:func:`run` in a runner process of its own, not sandboxed (the answer key, the self-test).

    Its caches go to a folder of its own, removed after: importing torch._dynamo (a dispatch mode
    does) makes ``/tmp/torchinductor_<user>``, and grading leaves nothing behind in a shared /tmp."""
    cmd = [sys.executable, "-m", "course_lib.grading.verdicts", "run"]
    with tempfile.TemporaryDirectory(prefix="course-runner-") as caches:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": caches, "TRITON_CACHE_DIR": caches}
        proc = subprocess.run(cmd, input=json.dumps(req), capture_output=True, text=True, timeout=timeout,
                              cwd=cwd, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"the grading runner failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def _fingerprint(req: dict) -> str:
    h = hashlib.sha256(json.dumps(req, sort_keys=True).encode())
    for path in sorted(Path(__file__).resolve().parents[1].rglob("*.py")):  # the references are course_lib's
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
    from . import checks, wire

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
            actual = wire.decode(got["actual"])
        except wire.WireError as e:
            return f"{want['what']}: the answer's value could not be read ({e})"
        # an observation that failed is described by the graded run (what it saw), others by the key
        what = str(got.get("what"))[:1000] if want["kind"] == "true" and got.get("what") else want["what"]
        try:
            checks.JUDGES[want["kind"]](actual, wire.decode(want["expected"]), what,
                                        **_params_from_data(want["params"]))
        except AssertionError as e:
            return str(e)
        except Exception as e:  # noqa: BLE001 (a value of the wrong kind fails its check)
            return f"{want['what']}: {type(e).__name__}: {str(e)[:300]}"
    if error:
        return f"the tests stopped: {error}"
    if len(record) != len(key):
        return "the tests took another path with this answer (more checks than the tests have)"
    return None


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if args[:1] != ["run"]:
        print("usage: python -m course_lib.grading.verdicts run < request.json", file=sys.stderr)
        return 2
    harden.undumpable()  # its output and memory out of every answer's reach, and no signal stops it
    harden.deaf()
    req = json.loads(sys.stdin.read())
    deadline = float(args[1]) if len(args) > 1 else None
    out = run(req, deadline)
    sys.stdout.write(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
