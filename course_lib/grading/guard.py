"""A Jupyter kernel in which a submission's code cannot forge the verdict of a test cell.

Started as ``python -m course_lib.grading.guard -f {connection_file}`` (:func:`install_kernelspec`
writes the kernelspec), it is ipykernel's IPython kernel with one duty more. Test and set-up cells
are known by the sha256 of their source (``COURSE_GUARD_TESTS``, ``COURSE_GUARD_SETUP``, comma
separated; :func:`environment` computes both from the notebook being graded).

- At the first cell, before any notebook code runs, the kernel imports the protected modules
  (builtins, sys, math, numpy, torch, torch.nn.functional, torch.testing, einops, course_lib and
  its submodules, IPython's and ipykernel's machinery) and takes a snapshot of: each module's
  functions, classes and submodules and its ``sys.modules`` entry; the methods of torch.Tensor,
  nn.Module, nn.Parameter, every course_lib class and the classes of the kernel, the shell, the
  display hook, the session and the sockets; the shell's input transformers, AST transformers,
  event callbacks and custom exception handler; sys.excepthook, displayhook, stdout and stderr.
- A set-up cell runs on the restored snapshot; the modules, functions and classes it binds in the
  user namespace, and the event callbacks it registers, join the snapshot.
- Before a test cell everything is put back (values that now point elsewhere; instance attributes
  that shadow a method are removed; entries that libraries added later stay), trace and profile
  functions, timers and gc callbacks are cleared, and names of builtins that the test cell uses
  are unshadowed. The cell then runs without yielding to the event loop. After it, the same check
  runs again: anything changed while the tests ran (an answer that patches a helper when called)
  turns the cell into an error, ``GuardError``, so it earns no points.

Honest limit: this holds against code that uses the language as written (assignment, setattr,
IPython's and the interpreter's hooks). Code in the same process can still defeat any in-process
guard with ctypes, gc.get_referents, frame objects, a thread or signal handler that patches while
the tests run, or by editing this module's code objects; :mod:`course_lib.grading.flags` reports
such code for a person to read, and the sandbox bounds what it can reach.
"""

from __future__ import annotations

import ast
import builtins
import gc
import hashlib
import importlib
import json
import os
import pkgutil
import signal
import sys
import threading
import types
from pathlib import Path

from ipykernel.ipkernel import IPythonKernel
from ipykernel.zmqshell import ZMQInteractiveShell

KERNEL_NAME = "course-guarded"
TESTS_ENV, SETUP_ENV = "COURSE_GUARD_TESTS", "COURSE_GUARD_SETUP"
PROTECTED = [
    "builtins", "sys", "math", "numpy", "torch", "torch.nn", "torch.nn.functional", "torch.testing",
    "torch.testing._comparison", "einops", "ast", "codeop", "traceback", "threading", "gc", "signal",
    "IPython.core.interactiveshell", "IPython.core.ultratb", "IPython.core.displayhook",
    "IPython.core.events", "IPython.core.inputtransformer2", "IPython.core.compilerop",
    "IPython.core.async_helpers", "ipykernel.ipkernel", "ipykernel.kernelbase", "ipykernel.zmqshell",
    "ipykernel.iostream", "ipykernel.jsonutil", "ipykernel.displayhook", "jupyter_client.session",
]
# course_lib's tooling is not what test cells call (and some of it runs a command when imported).
NOT_PROTECTED = ("course_lib.grading.",)
ALSO_PROTECTED = ("course_lib.grading", "course_lib.grading.checks", "course_lib.grading.config")
# Where a callback that a library (matplotlib's inline backend, say) registers lazily lives.
LIBRARY_DIRS = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})

_MISSING = object()
_IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: C types whose dict cannot change
# Bound now, so that patching these names elsewhere does not reach the guard.
_sha256, _settrace, _setprofile = hashlib.sha256, sys.settrace, sys.setprofile
_thread_settrace, _thread_setprofile = threading.settrace, threading.setprofile
_type_setattr, _type_delattr, _parse, _walk = type.__setattr__, type.__delattr__, ast.parse, ast.walk


class GuardError(Exception):
    """Protected code or hooks changed while a test cell ran."""


def digest(source: str) -> str:
    """The sha256 hex digest by which the kernel recognises a cell: ``digest("x = 1")`` -> ``'4b2e...'``."""
    return _sha256(source.encode("utf-8")).hexdigest()


def environment(nb) -> dict[str, str]:
    """The kernel's environment variables naming the test cells and set-up cells of ``nb``."""
    from . import notebook  # imports nbformat, which the kernel itself never needs (seconds to import)

    tests = [c.source for c in nb.cells if c.cell_type == "code" and notebook.nbgrader_meta(c).get("grade")]
    setup = [nb.cells[i].source for i in notebook.setup_cells(nb)]
    return {TESTS_ENV: ",".join(digest(s) for s in tests), SETUP_ENV: ",".join(digest(s) for s in setup)}


def install_kernelspec(directory: Path) -> str:
    """Write ``<directory>/kernels/<name>/kernel.json`` for this kernel and return its name."""
    spec_dir = Path(directory) / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [sys.executable, "-m", "course_lib.grading.guard", "-f", "{connection_file}"],
            "display_name": "Python 3 (course, guarded)", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
    return KERNEL_NAME


def _is_code(value) -> bool:
    return isinstance(value, (type, types.ModuleType)) or callable(value)


def _same(current, saved) -> bool:
    """Identity, or the same bound method made again (``obj.method`` is a new object each time)."""
    if current is saved:
        return True
    return (type(current) is types.MethodType and type(saved) is types.MethodType
            and current.__func__ is saved.__func__ and current.__self__ is saved.__self__)


def _from_library(func) -> bool:
    """Whether ``func`` is a function or method defined in an installed file (not in a cell)."""
    func = getattr(func, "__func__", func) if type(func) is types.MethodType else func
    if type(func) is not types.FunctionType:
        return False
    return os.path.realpath(func.__code__.co_filename).startswith(LIBRARY_DIRS)


def _import_protected() -> list[types.ModuleType]:
    names = list(PROTECTED)
    import course_lib
    names.append("course_lib")
    for info in pkgutil.walk_packages(course_lib.__path__, "course_lib.", onerror=lambda name: None):
        if not info.name.endswith("__main__") and (
                not info.name.startswith(NOT_PROTECTED) or info.name in ALSO_PROTECTED):
            names.append(info.name)
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except Exception:  # an optional dependency (einops) or a module that needs more than imports
            continue
    return list({id(m): m for m in modules}.values())


class Snapshot:
    """What a test cell may rely on, and how to put it back: see the module docstring."""

    def __init__(self, kernel: GuardedKernel):
        shell = kernel.shell
        self.modules = _import_protected()
        self.sys_modules = {m.__name__: m for m in self.modules}
        self.module_dicts = [(vars(m), {k: v for k, v in vars(m).items() if _is_code(v)})
                             for m in self.modules]
        self.machinery = [o for o in (
            kernel, shell, shell.displayhook, shell.display_pub, shell.compile,
            shell.input_transformer_manager, shell.events, shell.InteractiveTB, shell.SyntaxTB,
            shell.builtin_trap, shell.display_trap,
            kernel.session, kernel.iopub_socket, getattr(kernel, "iopub_thread", None),
        ) if o is not None]
        known = {id(o) for o in self.machinery}
        self.objects = [(o, self._object_entries(o, known)) for o in self.machinery]
        import torch
        classes = [torch.Tensor, torch.nn.Module, torch.nn.Parameter] + [type(o) for o in self.machinery]
        for module in self.modules:  # classes defined in course_lib and in the kernel's machinery
            if not module.__name__.startswith(("torch", "numpy", "builtins", "sys")):
                classes += [v for v in vars(module).values()
                            if isinstance(v, type) and v.__module__ == module.__name__]
        mro = {id(c): c for cls in classes for c in cls.__mro__ if not c.__flags__ & _IMMUTABLE_TYPE}
        self.classes = [(c, {k: v for k, v in vars(c).items() if _is_code(v) or hasattr(type(v), "__get__")})
                        for c in mro.values()]
        self.lists = {  # lists whose content matters, with the content they must have
            "input transformers": (shell.input_transformer_manager.cleanup_transforms,),
            "line transformers": (shell.input_transformer_manager.line_transforms,),
            "token transformers": (shell.input_transformer_manager.token_transformers,),
            "AST transformers": (shell.ast_transformers,),
            "post input transformers": (shell.input_transformers_post,),
            "gc callbacks": (gc.callbacks,),
            **{f"{event} callbacks": (cbs,) for event, cbs in shell.events.callbacks.items()},
        }
        self.lists = {name: (lst, list(lst)) for name, (lst,) in self.lists.items()}
        self.hooks = {"excepthook": sys.excepthook, "displayhook": sys.displayhook,
                      "stdout": sys.stdout, "stderr": sys.stderr}
        self.user_ns = shell.user_ns
        self.user_builtins = shell.user_ns.get("__builtins__", builtins)
        self.user_bindings: dict[str, object] = {}
        self.shell = shell

    @staticmethod
    def _object_entries(obj, known: set[int]) -> list[tuple[dict, dict]]:
        """The instance entries of ``obj`` (its ``__dict__`` and traitlets values) that are code,
        another piece of the machinery, or a handler setting that IPython reads."""
        explicit = {"custom_exceptions", "trio_runner", "_user_ns", "user_module", "loop_runner"}
        out = []
        for mapping in (getattr(obj, "__dict__", None), getattr(obj, "_trait_values", None)):
            if isinstance(mapping, dict):
                out.append((mapping, {k: v for k, v in mapping.items()
                                      if _is_code(v) or id(v) in known or k in explicit}))
        return out

    def trust_setup(self, before: dict[str, object]) -> None:
        """A set-up cell has run: what it bound and registered is part of the snapshot from now on."""
        for name, value in self.user_ns.items():
            if _is_code(value) and not name.startswith("_") and before.get(name, _MISSING) is not value:
                self.user_bindings[name] = value
        for event, cbs in self.shell.events.callbacks.items():
            self.lists[f"{event} callbacks"] = (cbs, list(cbs))

    def restore(self, test_code: str | None = None) -> list[str]:
        """Put back everything the snapshot holds; return what had changed (empty when nothing did)."""
        changed: list[str] = []
        for name, module in self.sys_modules.items():
            if sys.modules.get(name) is not module:
                sys.modules[name] = module
                changed.append(f"sys.modules[{name!r}]")
        for mapping, saved in self.module_dicts:  # first, so that what follows calls the real functions
            changed += _put_back(mapping, saved, mapping.__setitem__, mapping.get("__name__", "?"))
        if sys.gettrace() is not None or sys.getprofile() is not None:
            changed.append("a trace or profile function")
        _settrace(None), _setprofile(None), _thread_settrace(None), _thread_setprofile(None)
        for timer in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF):
            if signal.getitimer(timer) != (0.0, 0.0):  # a signal handler could patch while the tests run
                signal.setitimer(timer, 0)
                changed.append("a timer")
        for cls, saved in self.classes:
            changed += _put_back_class(cls, saved)
        for obj, entries in self.objects:
            for mapping, saved in entries:
                changed += _put_back(mapping, saved, mapping.__setitem__, type(obj).__name__)
            changed += _unshadow_object(obj, entries[0][1] if entries else {})
        changed += self._restore_lists()
        for name, value in self.hooks.items():
            if getattr(sys, name) is not value:
                setattr(sys, name, value)
                changed.append(f"sys.{name}")
        changed += self._restore_user_ns(test_code)
        return changed

    def _restore_lists(self) -> list[str]:
        changed = []
        callbacks = self.shell.events.callbacks
        for event in list(callbacks):
            if f"{event} callbacks" not in self.lists:
                del callbacks[event]
        for name, (lst, content) in self.lists.items():
            if name.endswith(" callbacks") and name != "gc callbacks":
                event = name[: -len(" callbacks")]
                if callbacks.get(event) is not lst:
                    callbacks[event] = lst
                # a library may register its own callback later (matplotlib's inline backend does)
                content += [f for f in lst if not any(_same(f, g) for g in content) and _from_library(f)]
                self.lists[name] = (lst, content)
            if len(lst) != len(content) or not all(_same(a, b) for a, b in zip(lst, content, strict=True)):
                lst[:] = content
                changed.append(name)
        return changed

    def _restore_user_ns(self, test_code: str | None) -> list[str]:
        ns, changed = self.user_ns, []
        if ns.get("__builtins__") is not self.user_builtins:
            ns["__builtins__"] = self.user_builtins
            changed.append("__builtins__ of the notebook")
        for name, value in self.user_bindings.items():
            if ns.get(name, _MISSING) is not value:
                ns[name] = value
                changed.append(f"the notebook's {name!r} from the set-up cells")
        for name in _names_used(test_code or ""):
            if name in ns and name not in self.user_bindings and hasattr(builtins, name):
                del ns[name]
                changed.append(f"the notebook's {name!r}, which hid the builtin")
        return changed


def _put_back(mapping, saved: dict, put, owner: str) -> list[str]:
    changed = []
    for key, value in saved.items():
        current = mapping.get(key, _MISSING)
        if _same(current, value):
            continue
        if _from_library(current) and getattr(current, "__wrapped__", None) is value:
            saved[key] = current  # a library wrapped it (torch._dynamo wraps torch.manual_seed on import)
            continue
        put(key, value)
        changed.append(f"{owner}.{key}")
    return changed


def _put_back_class(cls: type, saved: dict) -> list[str]:
    changed = _put_back(cls.__dict__, saved, lambda k, v: _type_setattr(cls, k, v), cls.__qualname__)
    return changed + _unshadow_class(cls, saved)


def _unshadow_class(cls: type, saved: dict) -> list[str]:
    """Remove entries added to ``cls`` that hide a method of one of its base classes."""
    if len(cls.__dict__) <= len(saved):
        return []
    changed = []
    for key in [k for k in cls.__dict__ if k not in saved]:
        if any(key in vars(base) for base in cls.__mro__[1:]) and _is_code(cls.__dict__[key]):
            _type_delattr(cls, key)
            changed.append(f"{cls.__qualname__}.{key}")
    return changed


def _unshadow_object(obj, saved: dict) -> list[str]:
    """Remove instance attributes of ``obj`` that hide a method of its class, unless ``saved`` has them."""
    mapping = getattr(obj, "__dict__", None)
    if not isinstance(mapping, dict):
        return []
    changed = []
    for key in [k for k, v in mapping.items() if k not in saved and _is_code(v)]:
        method = getattr(type(obj), key, None)
        if isinstance(method, (types.FunctionType, types.BuiltinFunctionType, types.MethodDescriptorType)):
            del mapping[key]
            changed.append(f"{type(obj).__name__}.{key} on the instance")
    return changed


def _names_used(code: str) -> set[str]:
    try:
        tree = _parse(code)
    except (SyntaxError, ValueError):
        return set()
    return {n.id for n in _walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


class GuardedShell(ZMQInteractiveShell):
    """IPython's kernel shell, except that a test cell never yields to the event loop, so no callback
    the notebook scheduled there runs between the restore and the tests."""

    guard_sync = False

    def should_run_async(self, raw_cell, *, transformed_cell=None, preprocessing_exc_tuple=None) -> bool:
        if self.guard_sync:
            return False
        return super().should_run_async(raw_cell, transformed_cell=transformed_cell,
                                        preprocessing_exc_tuple=preprocessing_exc_tuple)


class GuardedKernel(IPythonKernel):
    """ipykernel's kernel that restores the snapshot around test cells (see the module docstring)."""

    implementation = "course-guarded"
    shell_class = GuardedShell

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.guard_tests = frozenset(filter(None, os.environ.get(TESTS_ENV, "").split(",")))
        self.guard_setup = frozenset(filter(None, os.environ.get(SETUP_ENV, "").split(",")))
        self.guard_snapshot: Snapshot | None = None  # taken before the first message is handled

    def start(self):
        # The message loop keeps the handler it is given here: a closure that pins the guard first.
        entry = _pinned_entry(self, self.shell_main)
        self.shell_main = entry
        super().start()
        del self.shell_main

    async def do_execute(self, code, silent, store_history=True, user_expressions=None, allow_stdin=False,
                         *, cell_meta=None, cell_id=None):
        snapshot, key = self.guard_snapshot, digest(code)
        is_test, is_setup = key in self.guard_tests, key in self.guard_setup
        if is_test or is_setup:
            snapshot.restore(code if is_test else None)
        before = dict(self.shell.user_ns)
        self.shell.guard_sync = is_test
        try:
            reply = await super().do_execute(code, silent, store_history, user_expressions, allow_stdin,
                                             cell_meta=cell_meta, cell_id=cell_id)
        finally:
            self.shell.guard_sync = False
        if is_setup:
            snapshot.trust_setup(before)
        if is_test:
            changed = snapshot.restore(code)
            if changed:
                reply = self._fail(reply, changed)
        return reply

    def _fail(self, reply: dict, changed: list[str]) -> dict:
        """Turn a test cell's result into an error: it changed what the tests rely on."""
        shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
        message = f"protected code or hooks changed while the tests ran: {shown}"
        self.shell._showtraceback(GuardError, GuardError(message), [f"GuardError: {message}"])
        return {**reply, "status": "error", "ename": "GuardError", "evalue": message,
                "traceback": [f"GuardError: {message}"], "user_expressions": {}}


def _pinned_entry(kernel: GuardedKernel, shell_main):
    """Wrap the kernel's shell-message handler so that, before each message, this module's globals,
    the builtins, the kernel's classes, instance and handler table, and the guard's own state are
    as they were at start: the path to :meth:`GuardedKernel.do_execute` cannot be redirected with
    attribute assignments. Only closure variables are read until the two dicts are back."""
    module_dict, module_saved = globals(), dict(globals())
    builtins_dict, builtins_saved = vars(builtins), dict(vars(builtins))
    missing = object()
    classes = [(c, dict(vars(c))) for c in type(kernel).__mro__ if not c.__flags__ & _IMMUTABLE_TYPE]
    handlers, handlers_saved = kernel.shell_handlers, dict(kernel.shell_handlers)
    state = {k: kernel.__dict__[k] for k in ("guard_tests", "guard_setup")}

    async def entry(subshell_id, msg):
        for key, value in module_saved.items():
            if module_dict.get(key, missing) is not value:
                module_dict[key] = value
        for key, value in builtins_saved.items():
            if builtins_dict.get(key, missing) is not value:
                builtins_dict[key] = value
        for cls, saved in classes:
            _put_back_class(cls, saved)
        _unshadow_object(kernel, {})
        _put_back(handlers, handlers_saved, handlers.__setitem__, "shell_handlers")
        _put_back(kernel.__dict__, state, kernel.__dict__.__setitem__, "kernel")
        if not snapshot:  # the first message (kernel_info), before any notebook code
            snapshot.append(Snapshot(kernel))
        kernel.__dict__["guard_snapshot"] = snapshot[0]
        await shell_main(subshell_id, msg)

    snapshot: list[Snapshot] = []
    return entry


def main() -> None:
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(kernel_class=GuardedKernel)


if __name__ == "__main__":
    # Run from the importable module, not __main__, whose place IPython gives the notebook.
    from course_lib.grading import guard

    guard.main()
