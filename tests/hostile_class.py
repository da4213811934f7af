"""A class as an instructor receives it: a Moodle-style export of chapter 02 with one submission
per attack and per kind of breakage an examiner tried, and the points each student must get.

``build(zip_path, ctx)`` writes the export and returns ``{student key: Expected}``. Every attack
is bounded (at most a few hundred processes, about 3 GB of memory, 2 GB of writes), so it
cannot hurt the machine even if a limit did not hold. ``ctx`` names the host paths an attack
tries to reach, so the test can check afterwards that nothing there changed.
"""

from __future__ import annotations

import json
import stat
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from course_tools import config, notebook
from course_tools.grading.grader import collect
from tests.helpers import answered, mutants

CHAPTER = "02_attention"


@dataclass
class Context:
    grading: Path      # the grading folder (gradebook, other students' work)
    marker: str        # in every file an attack writes and every process it leaves behind
    secret_env: str    # a variable set in the grader's environment
    host_socket: Path  # a Unix socket listening on the host


@dataclass
class Expected:
    points: float | None          # autograded points; None for a row with a problem
    problem: str = ""             # words the problem column must contain
    output: list[str] = field(default_factory=list)  # words some cell output must contain
    notes: str = ""               # words the notes column must contain
    flags: str = ""               # words the flags column must contain


def _points() -> dict[str, float]:
    return {ex.name: ex.points for ex in notebook.exercises(notebook.read(config.solution_path(CHAPTER)))}


FULL = sum(_points().values())


def _cell(nb, grade_id):
    return next(c for c in nb.cells if notebook.nbgrader_meta(c).get("grade_id") == grade_id)


def _with(nb, *sources, at: int = 3):
    """``nb`` with extra code cells (the student's own) inserted after the set-up cells."""
    for i, src in enumerate(sources):
        nb.cells.insert(at + i, nbformat.v4.new_code_cell(src))
    return nb


def _wrong_everywhere():
    nb = answered(CHAPTER)
    done = set()
    for m in mutants(CHAPTER):
        cell = _cell(nb, m["grade_id"])
        if m["grade_id"] not in done and "find" in m and m["find"] in cell.source:
            cell.source = cell.source.replace(m["find"], m["replace"], 1)
            done.add(m["grade_id"])
    assert done == set(_points()), "every exercise needs a find/replace mutant"
    return nb


def _escape(ctx: Context) -> str:
    root, venv = config.root(), Path(sys.prefix)
    site = next(venv.glob("lib/python3*/site-packages"), venv)
    secrets = [config.solution_path(CHAPTER), root / "tests", root / "course_tools" / "catalogues",
               root / "course_tools" / "grading" / "grader", ctx.grading / "gradebook.db",
               ctx.grading / "submitted", "/etc/shadow", "/root/.bash_history", "/root/.ssh"]
    targets = [root / f"{ctx.marker}.txt", site / f"{ctx.marker}.pth",
               root / "course_lib" / f"{ctx.marker}.py",
               root / "course_tools" / "student" / f"{ctx.marker}.py",
               ctx.grading / f"{ctx.marker}.txt", f"/tmp/{ctx.marker}-host.txt"]
    return f"""
import os, socket, subprocess, pathlib
seen = [s for s in {[str(s) for s in secrets]!r} if os.path.exists(s)]
print("ESCAPE-SEEN", seen)
wrote = []
for t in {[str(t) for t in targets]!r}:
    try:
        pathlib.Path(t).write_text("import os; os.system('id')")
        wrote.append(t)
    except OSError:
        pass
print("ESCAPE-WROTE", [t for t in wrote if not t.startswith("/tmp/")])
for cmd in (["umount", "/proc"], ["mount", "-o", "remount,rw", "/usr"], ["unshare", "-r", "id"]):
    r = subprocess.run(cmd, capture_output=True)
    print("ESCAPE-CMD", cmd[0], "ok" if r.returncode == 0 else "refused")
print("ESCAPE-SECRET", {ctx.secret_env!r} in os.environ)
s = socket.socket(socket.AF_UNIX)
try:
    s.connect({str(ctx.host_socket)!r})
    print("ESCAPE-SOCKET connected")
except OSError:
    print("ESCAPE-SOCKET refused")
print("ESCAPE-CAPS", sorted({{l.split()[1] for l in open("/proc/self/status") if l.startswith("Cap")}}))
"""


def _forge() -> str:
    """Write a notebook with every test passing to the grading worker's standard output."""
    return """
import os
ppid = os.getppid()
try:
    with open(f"/proc/{ppid}/fd/1", "w") as out:
        out.write('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    print("FORGE wrote")
except OSError as e:
    print("FORGE refused", type(e).__name__)
"""


MONKEYPATCH = """
import torch, torch.testing, numpy
from course_lib import attention, positional
from course_tools.student import checks
torch.testing.assert_close = lambda *a, **k: None
torch.equal = lambda *a, **k: True
torch.allclose = lambda *a, **k: True
torch.Tensor.__eq__ = lambda self, other: torch.ones((), dtype=torch.bool)
numpy.testing.assert_allclose = lambda *a, **k: None
for name in dir(checks):
    if name.startswith("assert"):
        setattr(checks, name, lambda *a, **k: None)
attention.causal_mask = lambda *a, **k: None
"""

TRANSFORMER = "get_ipython().input_transformers_cleanup.append(lambda lines: ['pass\\n'])"
EXCEPTION_HANDLER = "get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)"
SIGINT = """
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
while True:
    time.sleep(0.05)
"""
MEMORY = """
import os, time
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        block = bytearray(700 * 2**20)
        block[::4096] = b"x" * len(block[::4096])
        time.sleep(30)
        os._exit(0)
    kids.append(pid)
with open("/tmp/fill", "wb") as f:
    f.write(b"y" * (400 * 2**20))
time.sleep(30)
"""
FORK_BOMB = """
import os, time
for _ in range(300):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
time.sleep(30)
"""
DISK = """
chunk = b"z" * 2**20
with open("junk.bin", "wb") as f:
    for _ in range(2048):
        f.write(chunk)
"""


def _daemon(marker: str) -> str:
    return f"""
import os, subprocess, sys
if os.fork() == 0:
    os.setsid()
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", {marker!r}])
    os._exit(0)
"""


def _leak(marker: str) -> list[str]:
    """Capture every cell's source as it is compiled; print them all at the end; script in HTML."""
    capture = ("import sys\n_seen = []\n"
               "sys.addaudithook(lambda event, args: _seen.append(args[0]) "
               "if event == 'compile' and isinstance(args[0], (str, bytes)) else None)")
    show = ("from IPython.display import HTML, display\n"
            f"display(HTML('<script>alert(\"{marker}\")</script>'))\n"
            "print('LEAK', [s.decode() if isinstance(s, bytes) else s for s in _seen])")
    return [capture, show]


def _tampered_metadata():
    nb = answered(CHAPTER)
    test = _cell(nb, "ex_causal_mask_test")
    test.metadata["nbgrader"]["grade"] = False
    invented = nbformat.v4.new_code_cell("assert True")
    invented.metadata["nbgrader"] = {"grade": True, "grade_id": "ex_bonus_test", "locked": True,
                                     "points": 100, "schema_version": 3, "solution": False, "task": False}
    nb.cells.insert(4, invented)
    return nb


def _rearranged(nb):
    tests = [_cell(nb, name + config.TEST_SUFFIX) for name in _points()]
    nb.cells.remove(tests[0])                                 # deleted
    tests[1].source = "pass"                                  # emptied
    nb.cells.insert(3, nbformat.from_dict(dict(tests[2])))    # duplicated, before its answer
    nb.cells.remove(tests[3])
    nb.cells.append(tests[3])                                 # moved to the end
    return nb


def _broken():
    nb = answered(CHAPTER)
    sabotage = ["while True:\n    pass", "def broken(:\n    pass", "import os\nos._exit(1)",
                "import not_a_module_anywhere", "raise RuntimeError('student bug')"]
    names = list(_points())
    for name, bad in zip(names, sabotage, strict=False):
        _cell(nb, name).source = bad + "\n" + _cell(nb, name).source
    return nb, sum(_points()[n] for n in names[len(sabotage):])


def _json(nb) -> bytes:
    return nbformat.writes(nb).encode()


def build(zip_path: Path, ctx: Context, only: set[str] | None = None) -> dict[str, Expected]:
    """Write the export; returns what each student (by collect's key) must get. ``only``: the
    keys of the students to put in it (all when None)."""
    points = _points()
    wrong = next(m for m in mutants(CHAPTER) if m["grade_id"] == "ex_causal_mask")
    broken, broken_points = _broken()
    other = notebook.read(config.student_path("01_tokenization"))
    entries: list[tuple[str, bytes, float]] = []  # (file name in the export, bytes, age in days)
    expected: dict[str, Expected] = {}

    def moodle(name: str, lms_id: int, nb_or_bytes, exp: Expected | None, file="02_attention.ipynb", age=1.0):
        key = collect.normalise(f"{name}_{lms_id}")
        if only is not None and key not in only:
            return
        data = nb_or_bytes if isinstance(nb_or_bytes, bytes) else _json(nb_or_bytes)
        entries.append((f"{name}_{lms_id}_assignsubmission_file_{file}", data, age))
        if exp is not None:
            expected[key] = exp

    moodle("Jane Doe", 1001, answered(CHAPTER), Expected(FULL))
    moodle("Jane Doe", 1002, answered(CHAPTER, mutant=wrong), Expected(FULL - points["ex_causal_mask"]))
    moodle("王小明", 1003, answered(CHAPTER), Expected(FULL))
    moodle("Ann Lee", 1004, answered(CHAPTER), Expected(FULL), file="final.ipynb", age=1.0)
    untouched = notebook.read(config.student_path(CHAPTER))
    moodle("Ann Lee", 1004, untouched, None, file="final_old.ipynb", age=3.0)
    moodle("Bo Chen", 1005, answered(CHAPTER), Expected(FULL), file="ATTENTION.IPYNB")
    warned = answered(CHAPTER)
    cell = _cell(warned, "ex_attention_weights")
    cell.source = "import warnings\n" + cell.source.replace(
        "### BEGIN SOLUTION\n",
        "### BEGIN SOLUTION\n    warnings.warn('this API will change', FutureWarning)\n", 1)
    assert "FutureWarning" in cell.source
    moodle("Cy Dee", 1006, warned, Expected(FULL))
    moodle("Di Ez", 1007, _with(answered(CHAPTER), SIGINT), Expected(FULL, output=["CellTimeoutError"]))
    moodle("Ed Fox", 1008, _tampered_metadata(), Expected(FULL, notes="ex_causal_mask_test"))
    moodle("Flo Gee", 1009, _with(answered(CHAPTER), MEMORY), Expected(FULL, output=["GiB of memory"]))
    moodle("Gus Hay", 1010, _with(answered(CHAPTER), FORK_BOMB), Expected(FULL, output=["processes"]))
    moodle("Hal Ive", 1011, _with(answered(CHAPTER), DISK), Expected(FULL, output=["No space left"]))
    moodle("Ida Jo", 1012, _with(answered(CHAPTER), _daemon(ctx.marker)), Expected(FULL))
    moodle("Jo Kay", 1013, _with(answered(CHAPTER), _escape(ctx)), Expected(FULL, output=[
        "ESCAPE-SEEN []", "ESCAPE-WROTE []", "ESCAPE-CMD umount refused", "ESCAPE-CMD mount refused",
        "ESCAPE-CMD unshare refused", "ESCAPE-SECRET False", "ESCAPE-SOCKET refused",
        "ESCAPE-CAPS ['0000000000000000']"]))
    leak = _with(answered(CHAPTER), _leak(ctx.marker)[0])
    leak.cells.append(nbformat.v4.new_code_cell(_leak(ctx.marker)[1]))
    leak.cells.append(nbformat.v4.new_markdown_cell(f"<script>alert('{ctx.marker}')</script>"))
    moodle("Kim Lo", 1014, leak, Expected(FULL, flags="audit hook"))
    moodle("Lu Ma", 1015, broken, Expected(broken_points, output=["DeadKernelError", "student bug"]))
    moodle("Mo Ne", 1016, _rearranged(answered(CHAPTER)), Expected(FULL))
    moodle("No Oh", 1017, _rearranged(_wrong_everywhere()), Expected(0.0))
    moodle("Ole Pi", 1018, b"{this is not json", Expected(None, problem="not a valid notebook"))
    moodle("Pam Qu", 1019, nbformat.v4.new_notebook(), Expected(None, problem="empty"))
    moodle("Quin Ra", 1020, other, Expected(None, problem=f"not the {CHAPTER} notebook"))
    moodle("Ray Su", 1021, b"%PDF-1.4", Expected(None, problem="no notebook"), file="report.pdf")
    # A symlink to the gradebook, written as such into the zip below.
    moodle("Sam Tu", 1022, b"", Expected(None, problem="no notebook"), file="link.ipynb")
    moodle("Tia Uv", 1023, notebook.read(config.student_path(CHAPTER)), Expected(0.0))
    moodle("Uma Vi", 1024, _with(notebook.read(config.student_path(CHAPTER)), TRANSFORMER),
           Expected(0.0, flags="input transformers"))
    moodle("Val Wu", 1025, _with(notebook.read(config.student_path(CHAPTER)), EXCEPTION_HANDLER),
           Expected(0.0, flags="custom exception handler"))
    moodle("Wes Xi", 1026, _with(_wrong_everywhere(), MONKEYPATCH),
           Expected(0.0, flags="assigns torch.equal"))
    moodle("Xia Yu", 1027, _with(notebook.read(config.student_path(CHAPTER)), _forge()),
           Expected(0.0, output=["FORGE refused"]))
    moodle("Cal De", 1032, _with(notebook.read(config.student_path(CHAPTER)), _forged_notebook()),
           Expected(0.0))
    moodle("Eve Gh", 1034, _borrowing(), Expected(points["ex_causal_mask"] + points["ex_sliding_window_mask"],
                                                   flags="this exercise's reference"))
    moodle("Fay Hi", 1035, _honest_tools(), Expected(FULL))
    moodle("Hu Jk", 1038, _fused_in_disguise(),
           Expected(0.0, flags="changed course_lib.attention.watch_tensors"))
    surrogates = answered(CHAPTER)
    surrogates.cells.append(nbformat.v4.new_markdown_cell("my notes \ud800 end"))
    _cell(surrogates, "ex_causal_mask_test").metadata["nbgrader"]["odd\ud800"] = 1
    moodle("Gil Ij", 1036, json.dumps(surrogates, ensure_ascii=True).encode(),  # as a browser may save it
           Expected(FULL, notes="restored from the release"))
    moodle("<b>Xss</b> =1+1", 1037, _with(answered(CHAPTER), "raise ValueError('x' * 50_000_000)"),
           Expected(FULL, output=["more characters not kept"]))
    for name, lms_id, nb, flagged in verdict_attacks().values():
        moodle(name, lms_id, nb, Expected(0.0, flags=flagged))

    now = time.time()
    with zipfile.ZipFile(zip_path, "w") as z:
        for name, data, age in entries:
            info = zipfile.ZipInfo(name, date_time=time.localtime(now - age * 86400)[:6])
            if name.endswith("link.ipynb"):  # a symlink to a host file, as zip tools store it
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
                data = str(ctx.grading / "gradebook.db").encode()
            z.writestr(info, data)
    return expected


# Attacks on the verdict itself: every answer is wrong, and each student tries one family of
# tricks in every answer cell, with names built at run time where a name would give it away.
STREAM_FORGERY = """
try:  # the kernel's own message stream: a result before the failure, a forged idle, then a clear
    _ip = get_ipython()
    _ip.display_pub.publish({"text/plain": "all tests passed"})
    _k = _ip.kernel
    _k.session.send(_k.iopub_socket, "status", {"execution_state": "idle"}, parent=_k.get_parent("shell"))
    _ip.events.register("post_run_cell", lambda *a: __import__("IPython.display").display.clear_output())
except Exception:
    pass
import torch as _t
_Equal = type("_Equal", (_t.Tensor,), {"__torch_function__": classmethod(
    lambda cls, f, types, args=(), kw=None: True
    if getattr(f, "__name__", "") in ("equal", "allclose", "__eq__")
    else _t.Tensor.__torch_function__.__func__(cls, f, types, args, kw or {}))})
"""
RUN_TIME_NAMES = """
import base64 as _b64
exec(_b64.b64decode({code!r}).decode())
"""
_INTROSPECTION = '''
import importlib, sys
_gc = importlib.import_module("g" + "c")
_frames = getattr(sys, "_get" + "frame")
try:
    for _o in _gc.get_referrers(sys.modules["course_tools.student.checks"]):
        pass
    _frames(0)
except Exception:
    pass
try:  # code under a library's file name
    _c = compile("import sys; sys.modules['course_tools.student.checks'].SAFETY = 1e12",
                 "/usr/lib/python3/x.py", "exec")
    exec(_c)
except Exception:
    pass
try:  # raw memory
    _ct = importlib.import_module("ct" + "ypes")
    _ct.pythonapi.Py_IsInitialized()
except Exception:
    pass
'''
PATCH_CHECKS = """
import importlib as _il
_ch = _il.import_module("course_tools." + "checks")
setattr(_ch, "SAF" + "ETY", 1e12)  # a tolerance factor the tests read
_real = {n: getattr(_ch, n) for n in ("assert_close", "assert_equal", "_check")}
def _steal(*a, **k):  # while the tests run: the expected value as the answer's
    if len(a) >= 2:
        a = (a[1], a[1]) + a[2:]
    return _real["assert_close"](*a, **k)
for _n in ("assert_close", "assert_equal"):
    setattr(_ch, _n, _steal)
"""
THREADS_AND_SIGNALS = """
import threading as _th, signal as _sg, time as _tm, importlib as _il
def _patch(*a):
    _ch = _il.import_module("course_tools.student.checks")
    for _n in ("assert_close", "assert_equal", "assert_true"):
        setattr(_ch, _n, lambda *a, **k: None)
try:
    _sg.signal(_sg.SIGALRM, _patch)
    _sg.setitimer(_sg.ITIMER_REAL, 0.01, 0.01)
except Exception:
    pass
try:
    _th.Thread(target=lambda: [(_patch(), _tm.sleep(0.001)) for _ in range(10**6)], daemon=True).start()
except Exception:
    pass
"""


def _borrowing():
    """Every answer wrong but two, which run course_lib's own reference: one by a name built at run
    time, one only where it sees no IPython (the graded run; the feedback run shows a stub)."""
    nb = _wrong_everywhere()
    _cell(nb, "ex_causal_mask").source = (
        "import importlib\ndef causal_mask(S, Sk=None):\n"
        "    module = importlib.import_module('course_lib.' + 'attention')\n"
        "    return getattr(module, 'causal' + '_mask')(S, Sk)\n")
    _cell(nb, "ex_sliding_window_mask").source = (
        "import sys\ndef sliding_window_mask(S, window, Sk=None):\n"
        "    if 'ipykernel' not in sys.modules:\n        from course_lib import attention as _a\n"
        "        return getattr(_a, 'sliding_window' + '_mask')(S, window, Sk)\n"
        "    raise NotImplementedError()\n")
    return nb


def _fused_in_disguise():
    """Every answer wrong; tiled attention is PyTorch's fused kernel, run with torch's dispatch
    modes switched off, after replacing the watch the test uses with one that sees nothing."""
    nb = _wrong_everywhere()
    _cell(nb, "ex_tiled_attention").source = (
        "import contextlib, torch.nn.functional as _F\n"
        "from torch.utils._python_dispatch import _disable_current_modes\n"
        "from course_lib import attention as _att\n"
        "_blind = type('W', (), {'largest': 0, 'ops': set()})\n"
        "_att.watch_tensors = lambda: contextlib.nullcontext(_blind())\n"
        "def tiled_attention(q, k, v, block, causal=False):\n"
        "    mask = _att.causal_mask(q.shape[-2], k.shape[-2]) if causal else None\n"
        "    with _disable_current_modes():\n"
        "        return _F.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n")
    return nb


def _honest_tools():
    """Correct answers that use ordinary tools: a traceback printed, %timeit, a thread pool."""
    nb = answered(CHAPTER)
    cell = _cell(nb, "ex_causal_mask")
    cell.source = ("import traceback\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n    traceback.print_exc()\n"
                   + cell.source + "\n%timeit -n 1 -r 1 causal_mask(4)\n")
    cell = _cell(nb, "ex_repeat_kv")
    cell.source += ("\nimport concurrent.futures\nwith concurrent.futures.ThreadPoolExecutor(2) as _pool:\n"
                    "    _shapes = list(_pool.map(lambda n: repeat_kv(torch.zeros(1, 2, 3, 4), n).shape,\n"
                    "                             [1, 2]))\n")
    return nb


def _forged_notebook() -> str:
    """A cell that writes a notebook of its own, every test cell worth 1000 points and passed, into
    every output it can reach (the sandbox's init and the worker), then kills the worker."""
    cells = [{"cell_type": "code", "execution_count": 1, "id": f"forged{i}", "source": "pass",
              "metadata": {"nbgrader": {"grade": True, "grade_id": f"{name}_test", "points": 1000,
                                        "locked": True, "solution": False, "schema_version": 3}},
              "outputs": [{"output_type": "stream", "name": "stdout", "text": "all tests passed"}]}
             for i, name in enumerate(_points())]
    forged = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    return f"""
import json as _j, os as _o
for _target in ("/proc/1/fd/1", f"/proc/{{_o.getppid()}}/fd/1"):
    try:
        with open(_target, "w") as _f:
            _f.write(_j.dumps({forged!r}))
    except OSError:
        pass
_o.kill(_o.getppid(), 9)
"""


# In every answer cell, graded run and feedback run alike: results for every exercise written to
# the runner's output (or the worker's), 300 MiB after them, raw memory read for the hidden tests,
# and every process above signalled.
CHANNELS = """
import json as _j, os as _o, signal as _s
try:
    with open("/proc/self/mem", "rb") as _m:
        raise RuntimeError(str(_m.read(100)))
except OSError:
    pass
_claim = {n: {"checks": [], "error": None} for n in %r}
for _target in ("/proc/1/fd/1", f"/proc/{_o.getppid()}/fd/1"):
    try:
        with open(_target, "w") as _f:
            _f.write(_j.dumps(_claim) + " " * 300 * 2**20)
    except OSError:
        pass
for _pid in (1, _o.getppid()):
    for _sig in (_s.SIGINT, _s.SIGTERM, _s.SIGKILL):
        try:
            _o.kill(_pid, _sig)
        except OSError:
            pass
"""


def _tricked(prefix: str):
    """Every answer wrong, each answer cell starting with ``prefix``."""
    nb = _wrong_everywhere()
    for name in _points():
        cell = _cell(nb, name)
        cell.source = prefix + "\n" + cell.source
    return nb


def verdict_attacks() -> dict[str, tuple]:
    """(name, lms id, notebook, the flags' words) of the students who attack the verdict."""
    import base64

    hidden = base64.b64encode(_INTROSPECTION.encode()).decode()
    return {
        "stream": ("Yan Zi", 1028, _tricked(STREAM_FORGERY), "get_ipython"),
        "names at run time": ("Zed Ab", 1029, _tricked(RUN_TIME_NAMES.format(code=hidden)),
                              "exec in <answer>"),
        "patched checks": ("Ada Bc", 1030, _tricked(PATCH_CHECKS), ""),
        "threads and signals": ("Bea Cd", 1031, _tricked(THREADS_AND_SIGNALS), "signal"),
        "channels": ("Dot Ef", 1033, _tricked(CHANNELS % sorted(_points())), "reading raw memory"),
    }
