"""The graded run: an exercise's tests on a student's answer, inside the sandbox. Decides nothing.

Runs inside the sandbox, beside student code. The grader (:mod:`course_tools.grading.grader.verdicts`)
sends a request: the chapter's set-up cells and, per exercise, the answer cell and the test code,
transformed so that no expected value is in it. This runner imports the libraries once, then forks
one fresh process per exercise: the set-up cells, the student's answer cell for that exercise and
nothing else the student wrote, then the test code in a namespace of its own. Each check of
:mod:`course_tools.student.checks` only *records* what the answer gave: values, as plain data
(:mod:`.wire`), and the observations a check makes while the answer runs (inputs changed in place,
the error raised, gradients). The record goes back through the runner's pipe; nothing the run
prints or publishes is read. The runner is the sandbox's init and non-dumpable (:mod:`.harden`): no
answer writes its output, reads its memory or stops it, and it takes each exercise's record only
from that exercise's pipe.

The answer key is made by the same code outside the sandbox, on the instructor's solution, with
each check's reference computed (``Session(recording=False)``).

While the answer and the tests run, an audit hook (:mod:`.guard`) refuses the interpreter's
introspection to code that is not the course's or a library's (frames, ``gc``'s object graph, code
and function objects made at run time, ``ctypes``' symbols, raw memory (``/proc/PID/mem``, from any
caller), trace and audit hooks, threads, signal handlers, new processes, modules imported again
after removal) and reports each use, and every ``exec``, ``eval`` or ``compile`` of a string, to
the runner as it happens, so that a first use is on record before it could try to silence the
hook. The reports become flags for a person.

    python -m course_tools.grading.sandboxed.graded_run run < request.json   # (used by the grader)
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import linecache
import os
import re
import secrets
import select
import signal
import sys
import time

from course_tools import notebook
from course_tools.grading.sandboxed import guard, harden, work_limit

MAX_RECORD_BYTES = 64 * 2**20  # one exercise's record, as sent
SETUP_S = 15  # beyond the cell limit, for a graded run's set-up cells and answer
CHECKS_NAME = "_graded_checks_"  # how transformed test code reaches the checks module


# --- what the checks report to ---------------------------------------------------------------

class Session:
    """Collects the checks of one test cell: the answer's side (``recording``) or the key's."""

    def __init__(self, recording: bool):
        self.recording = recording
        self.entries: list[dict] = []
        self.quiet = 0  # > 0 while a reference is computed (checks._reference)

    def check(self, kind: str, what: str, actual, expected, params: dict) -> None:
        from course_tools.grading.sandboxed import wire
        from course_tools.student import judges

        entry = {"kind": kind, "what": str(what)[:1000]}
        if self.quiet:
            judges.JUDGES[kind](actual, expected, what, **params)
            return
        if self.recording:
            entry["actual"] = wire.encode(actual)
        else:
            judges.JUDGES[kind](actual, expected, what, **params)  # the solution passes its own key
            entry["expected"] = wire.encode(expected)
            entry["params"] = _params_data(params)
        self.entries.append(entry)


def _params_data(params: dict) -> dict:
    from course_tools.grading.sandboxed import wire

    out = {}
    for name, value in params.items():
        if name == "types" and value is not None:
            classes = value if isinstance(value, tuple) else (value,)
            out[name] = {"types": [_type_name(c) for c in classes]}
        else:
            out[name] = wire.encode(value)
    return out


def key_types() -> dict[str, type]:
    """The types a key may ask an answer to have (``types=`` of a check), by name."""
    import numpy as np
    import torch

    return {"torch.Tensor": torch.Tensor, "int": int, "float": float, "bool": bool, "list": list,
            "tuple": tuple, "str": str, "dict": dict, "numpy.ndarray": np.ndarray}


def _type_name(cls: type) -> str:
    for name, known in key_types().items():
        if cls is known:
            return name
    raise TypeError(f"a check asks for type {cls!r}, which a key cannot hold")


def run(req: dict, deadline_s: float | None = None) -> dict:
    """Each exercise of ``req`` in a fresh child process (all in one child with ``req["batch"]``, for
    the graders' self-test); returns ``{name: result}`` where a result has ``checks`` (the session's
    entries), ``error`` (what stopped the tests, or None) and ``events`` (introspection refused or
    flagged while the answer ran)."""
    import matplotlib

    matplotlib.use("Agg")
    import numpy  # noqa: F401  (imported once here, before any fork)
    import torch  # noqa: F401

    from course_tools.student import checks  # noqa: F401

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

    from course_tools.student import checks

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


COURSE_PACKAGES = ("course_lib.", "course_tools.")
LIBRARIES = ("course_lib", "torch", "torch.nn.functional", "torch.testing", "numpy", "math", "builtins")


def _library_state() -> dict[str, dict]:
    """The attributes of the modules the tests use: course_lib's and course_tools' (the checks) and
    the libraries the tests compute with."""
    return {name: dict(vars(module)) for name, module in list(sys.modules.items())
            if module is not None and (name in LIBRARIES or name.startswith(COURSE_PACKAGES))}


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


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if args[:1] != ["run"]:
        print(f"usage: python -m {__spec__.name} run < request.json", file=sys.stderr)
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

