"""What a graded run refuses and observes while an answer runs (used by :mod:`.graded_run`).

**Sandboxed side**: runs inside the sandbox, beside student code; it decides no verdict.

An audit hook (``sys.addaudithook``: no Python code can list, reach or remove it) sees the
interpreter's introspection and decides whose it is. Code is *untrusted* if it is the answer's or
was compiled while untrusted code ran (an ``exec`` of a string, ``timeit``...); the set-up and
test cells are *trusted*; every other frame is a library's. Walking out from the event:

- a frame of an *allowed consumer* (:data:`CONSUMERS`: libraries that read frames for their own
  use and hand none back, such as ``collections.namedtuple``, ``typing``, torch's compilers, and
  traceback's functions that only print or format) ends the walk: the event is the library's;
- any other library frame is passed over, so no library (``logging.currentframe``, ``inspect``, a
  thread started by ``logging.handlers.QueueListener``) launders what the answer asks for;
- the first untrusted frame makes it the answer's; a trusted frame, nobody's.

The answer's frames, ``gc``'s object graph, code and function objects made at run time,
``ctypes``, trace, profile and audit hooks, signal handlers and new processes are refused
(``PermissionError``) and reported; raw memory (``/proc/PID/mem``) is refused to every caller.
Threads are the answer's own (what runs in them is judged as above), except inside
``checks.forbidding``, which watches the calls of one thread.
``exec``, ``eval`` and ``compile`` of a string and suspicious imports are reported.

Observed by identity, whatever the spelling: the exercise's own course_lib reference (each
course_lib function named like the exercise). Its code is swapped for a trampoline that raises the
audit event ``course.reference`` and then runs the original, held only in the trampoline's
constants; reading the reference's ``__code__`` is refused while an answer is on the stack. Each
call with the answer's code on the stack is reported (the tests may call it themselves), and so
is an answer that *is* the reference under its own name (:mod:`verdicts` checks identity).

The hook's state lives in its closure; the only objects an answer can reach are the guards on
thread and signal functions, which hold nothing but the original function and report through
``sys.audit``, so a guard bypassed gives back only what it guarded, never the hook's state.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pkgutil
import sys
import types
import warnings
from pathlib import Path

REFUSED = ("sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile", "sys.addaudithook",
           "sys._getframemodulename", "object.__setattr__", "object.__delattr__", "code.__new__",
           "function.__new__", "marshal.loads", "marshal.load", "os.system", "os.exec", "os.posix_spawn",
           "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen", "pty.spawn",
           "cpython.PyInterpreterState_New", "cpython._PySys_ClearAuditHooks")
REFUSED_PREFIXES = ("gc.", "ctypes.", "sys.monitoring")
IMPORT_MACHINERY = {"importlib", "zipimport", "pkgutil"}
SUSPICIOUS_IMPORTS = {"gc", "ctypes", "importlib", "threading", "_thread", "signal", "code",
                      "codeop", "marshal", "pickle", "dis", "multiprocessing", "subprocess", "pty"}
# Libraries that read frames for their own use and return none: an event inside them is theirs.
CONSUMERS = {"collections", "typing", "enum", "dataclasses", "abc", "warnings", "linecache", "torch",
             "numpy", "einops", "matplotlib", "IPython", "tqdm", "unittest", "doctest"}
# traceback's functions that print or format (and return no frame): honest ``print_exc()``.
TRACEBACK_TEXT = {"print_exc", "format_exc", "print_exception", "format_exception", "print_tb", "format_tb",
                  "print_last", "print_stack", "format_stack", "extract_stack", "extract_tb",
                  "format_exception_only"}
# Modules that hand the interpreter's machinery to whoever calls them: an ``exec`` or ``compile``
# raised in one of them is its caller's.
MECHANISMS = {"inspect", "traceback", "threading", "_thread", "code", "codeop", "runpy", "pdb", "bdb",
              "cgitb", "trace", "profile", "cProfile", "dis", "types", "functools", "operator", "contextlib",
              "signal", "concurrent", "asyncio", "multiprocessing", "copy", "copyreg", "pickle", "weakref",
              "gc", "ctypes", "importlib", "pkgutil", "zipimport", "timeit", "linecache", "tokenize", "io",
              "_io", "os", "subprocess", "pty", "shutil", "logging"}
THREAD_STARTS = {"_thread.start_new_thread", "_thread.start_new", "_thread.start_joinable_thread",
                 "threading._start_new_thread", "threading._start_joinable_thread"}
MEMORY_FILES = ("mem", "pagemap")
BORROWED = "this exercise's reference in the graded run"  # how a report of a reference run ends


def raw_memory(path) -> bool:
    """Whether opening ``path`` would read a process's memory: ``/proc/PID/mem`` however it is
    spelled (``/proc/self``, a link, a relative name from a folder of ``/proc``)."""
    if not isinstance(path, (str, bytes)):
        return False
    name = os.fsdecode(path)
    if os.path.basename(name) in MEMORY_FILES and not os.path.isabs(name):
        return True  # relative to a folder descriptor that may be /proc/PID
    real = os.path.realpath(name)
    return real.startswith("/proc/") and os.path.basename(real) in MEMORY_FILES


def library_dirs() -> tuple[str, ...]:
    dirs = {os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    tools = Path(__file__).resolve().parents[2]  # course_tools
    dirs |= {os.path.realpath(p) + os.sep for p in (tools, tools.parent / "course_lib")}
    return tuple(dirs)


def _is_code_file(path, library: tuple[str, ...]) -> bool:
    """A Python source, bytecode, extension or archive outside the installed libraries."""
    name = os.fsdecode(path)
    return name.endswith((".py", ".pyc", ".pyo", ".so", ".pth", ".zip", ".egg", ".whl")) and \
        not os.path.realpath(name).startswith(library)


def _module_root(frame) -> str:
    return str(frame.f_globals.get("__name__", "")).split(".")[0]


def _consumer(frame) -> bool:
    root = _module_root(frame)
    return root in CONSUMERS or (root == "traceback" and frame.f_code.co_name in TRACEBACK_TEXT)


# --- references, observed by identity ------------------------------------------------------------

def import_course_lib() -> None:
    """Import every course_lib module, so that each reference exists before an answer runs (the
    runner does it once, before it forks)."""
    import course_lib

    for info in pkgutil.walk_packages(course_lib.__path__, "course_lib."):
        with contextlib.suppress(Exception):
            importlib.import_module(info.name)


def references(exercise: str) -> list[types.FunctionType]:
    """course_lib's functions named like ``exercise`` (``ex_causal_mask``: every ``causal_mask``
    defined in a loaded course_lib module), undecorated."""
    from course_tools import config

    name = exercise.removeprefix(config.EXERCISE_PREFIX)
    found = {}
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("course_lib."):
            continue
        function = getattr(module, name, None)
        while hasattr(function, "__wrapped__"):
            function = function.__wrapped__
        if isinstance(function, types.FunctionType) and function.__module__ == module_name \
                and not function.__code__.co_freevars:
            found[id(function)] = function
    return list(found.values())


def _trampoline_code(function: types.FunctionType, label: str) -> types.CodeType:
    """Code that reports ``label`` through ``sys.audit`` and returns ``original(*a, **k)``, with the
    audit function and a copy of the original as constants (no name an answer could rebind)."""
    original = types.FunctionType(function.__code__, function.__globals__, function.__name__,
                                  function.__defaults__, None)
    original.__kwdefaults__ = function.__kwdefaults__
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # a string "called": replaced below
        template = compile("def _(*args, **kwargs):\n    '_audit'('course.reference', '_label')\n"
                           "    return '_original'(*args, **kwargs)\n", "<reference>", "exec")
    code = next(c for c in template.co_consts if isinstance(c, types.CodeType))
    values = {"_audit": sys.audit, "_label": label, "_original": original}
    return code.replace(co_consts=tuple(values.get(c, c) if isinstance(c, str) else c
                                        for c in code.co_consts),
                        co_name=function.__code__.co_name, co_filename=function.__code__.co_filename,
                        co_firstlineno=function.__code__.co_firstlineno)


def observe(functions: list[types.FunctionType]) -> None:
    """Swap each function's code for a trampoline (see the module docstring). Call before
    :func:`install`, which then refuses reading their ``__code__``."""
    for function in functions:
        function.__code__ = _trampoline_code(function, f"{function.__module__}.{function.__qualname__}")


# --- the hook ----------------------------------------------------------------------------------

def install(fd: int, trusted: tuple[str, ...], current: list[str], untrusted_names: tuple[str, ...],
            observed: list[types.FunctionType] = ()) -> None:
    """The graded run's audit hook and thread and signal guards (see the module docstring). Each
    report is a line of JSON written to ``fd`` as it happens; ``current[0]`` names the exercise."""
    import _thread
    import signal
    import threading

    library = library_dirs()
    loaded = set(sys.modules)
    getframe, write = sys._getframe, os.write
    busy, reported = [False], set()
    untrusted = set(untrusted_names)
    watched = {id(f) for f in observed}
    forbidding = [0]  # checks.forbidding blocks open: they watch one thread, so no other may start

    def answer_on_stack(depth: int, consumers: bool = True) -> str:
        """The untrusted file that asked for the event ``depth`` frames up (see the docstring), or ""."""
        frame = getframe(depth + 1)
        while frame is not None:
            name = frame.f_code.co_filename
            if name in untrusted:
                return name
            if name in trusted or (consumers and _consumer(frame)):
                return ""
            frame = frame.f_back
        return ""

    def culprit(depth: int, skip=MECHANISMS) -> str:
        """For ``exec`` and ``compile``: the untrusted file whose code raised the event, passing over
        the frames of ``skip`` only (importing a library compiles its code, for itself)."""
        frame = getframe(depth + 1)
        while frame is not None and _module_root(frame) in skip:
            frame = frame.f_back
        return frame.f_code.co_filename if frame is not None and frame.f_code.co_filename in untrusted else ""

    def running_untrusted() -> bool:
        return bool(answer_on_stack(2, consumers=False))

    def report(event: str, where: str) -> None:
        if (current[0], event, where) not in reported:
            reported.add((current[0], event, where))
            with contextlib.suppress(OSError):
                write(fd, (json.dumps({"event": f"{event} in {where}", "name": current[0]}) + "\n").encode())

    def refuse(event: str, where: str) -> None:
        if where:
            report(event, where)
            message = f"{event} is not allowed while an answer is graded"
            # CPython cancels a new audit hook, silently, only on a RuntimeError
            raise RuntimeError(message) if event == "sys.addaudithook" else PermissionError(message)

    def hook(event: str, args) -> None:
        if busy[0]:
            return
        busy[0] = True
        try:
            if event == "course.reference" and running_untrusted():  # tests may call it, to make inputs
                report(f"called course_lib's {args[0]}, this exercise's reference", "the graded run")
            elif event == "course.library_changed" and not running_untrusted():  # by the runner
                report(f"changed {str(args[0])[:80]} (put back for the tests)", "<answer>")
            elif event == "course.reference_given":  # by the runner: the answer's name is the reference
                report(f"gave as its answer course_lib's {args[0]}, this exercise's reference",
                       "the graded run")
            elif event == "course.forbidding" and not running_untrusted():  # checks.forbidding's block
                forbidding[0] = max(0, forbidding[0] + (1 if args[0] else -1))
            elif event == "course.guarded":
                if str(args[0]) not in THREAD_STARTS or forbidding[0]:
                    refuse(str(args[0]) if str(args[0]) not in THREAD_STARTS else "a thread, in a check of "
                           "what the answer calls (it would call it out of the check's sight),",
                           answer_on_stack(2))
            elif event.startswith("marshal.load"):  # importlib reads installed bytecode with it
                refuse(event, culprit(1, skip=()))
            elif event == "object.__getattr__" and args[1] == "__code__" and id(args[0]) in watched:
                refuse("reading a reference's code", answer_on_stack(1, consumers=False))
            elif event in REFUSED or event.startswith(REFUSED_PREFIXES) or (
                    event == "object.__getattr__" and str(args[1]).endswith("_frame")):  # tb_frame, gi_frame
                refuse(event if event != "object.__getattr__" else f"reading {args[1]}", answer_on_stack(1))
            elif event == "import" and args[0] in loaded and args[0] not in sys.modules:
                refuse(f"importing {args[0]} again", answer_on_stack(1))
            elif event == "open" and raw_memory(args[0]):  # whoever opens it: the answer is running
                refuse(f"reading raw memory ({os.fsdecode(args[0])[-40:]})",
                       answer_on_stack(1) or "a library")
            elif event == "open" and isinstance(args[0], (str, bytes)) and _is_code_file(args[0], library):
                refuse(f"loading code from {os.fsdecode(args[0])[-80:]}", answer_on_stack(1))
            elif event == "import":
                where = culprit(1)
                if where and args[0].split(".")[0] in SUSPICIOUS_IMPORTS:
                    report(f"import of {args[0]}", where)
            elif event in ("exec", "compile"):  # importing a module compiles and runs it: not the answer's
                where = culprit(1, skip=MECHANISMS - IMPORT_MACHINERY)
                if event == "compile" and isinstance(args[1], (str, bytes)):
                    name = os.fsdecode(args[1])
                    if where or running_untrusted() and not os.path.realpath(name).startswith(library):
                        untrusted.add(name)  # what it compiles is the answer's code too
                if where:
                    report(event, where)
        finally:
            busy[0] = False

    sys.addaudithook(hook)
    for module, names in ((_thread, ("start_new_thread", "start_new", "start_joinable_thread")),
                          (threading, ("_start_new_thread", "_start_joinable_thread")),
                          (signal, ("signal", "setitimer", "alarm", "set_wakeup_fd", "pthread_kill")),
                          (sys.modules.get("_signal"), ("signal", "setitimer", "alarm", "set_wakeup_fd")),
                          (sys, ("getprofile", "gettrace"))):
        for name in names:
            if module is not None and hasattr(module, name):
                setattr(module, name, _guarded(f"{module.__name__}.{name}", getattr(module, name)))


def _guarded(name: str, original):
    """``original`` behind the audit event ``course.guarded``, which the hook refuses when the
    answer asked for it. Nothing here but the two arguments."""
    def call(*args, **kwargs):
        sys.audit("course.guarded", name)
        return original(*args, **kwargs)
    return call
