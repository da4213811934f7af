"""The grading worker alone: sandbox confinement, its fallback, and surviving broken cells."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import nbformat
import pytest

from course_tools import config, notebook
from course_tools.grading.grader import mistakes, sandbox, watchdog
from course_tools.grading.sandboxed import worker
from tests.conftest import CHAPTERS, ROOT, skip_or_fail


def _notebook(*sources, setup=()):
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell("pass")]  # the install cell
    for src in setup:
        cell = nbformat.v4.new_code_cell(src)
        cell.metadata["tags"] = [config.SETUP_TAG]
        nb.cells.append(cell)
    nb.cells += [nbformat.v4.new_code_cell(s) for s in sources]
    return nb


def _texts(cell):
    return "".join(o.get("text", "") for o in cell.outputs), [o.ename for o in cell.outputs
                                                              if o.output_type == "error"]


def test_worker_survives_timeouts_kernel_death_and_huge_output(tmp_path):
    nb = _notebook("while True:\n    pass", "import os\nos._exit(3)", "print('x' * 10**7)",
                   "print(base + 1)", setup=["base = 41"])
    out = worker.execute(nb, timeout=3, path=str(tmp_path))
    assert _texts(out.cells[2])[1] == ["CellTimeoutError"]
    assert _texts(out.cells[3])[1] == ["DeadKernelError"]
    text, _ = _texts(out.cells[4])
    assert len(text) < 2 * worker.MAX_OUTPUT_CHARS and "output truncated" in text
    assert _texts(out.cells[5])[0] == "42\n"  # set-up re-run in the new kernel


def test_a_cell_that_ignores_interrupts_is_stopped_at_its_limit_and_the_notebook_at_its_own(tmp_path):
    stubborn = ("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "while True:\n    pass")
    nb = _notebook(stubborn, "print(base + 1)", stubborn, "print('late')", setup=["base = 41"])
    start = time.monotonic()
    # 8 s for the notebook: the first stubborn cell (3 CPU seconds) and two kernel starts leave the print
    # time to run however slow the starts (up to 4 s together), and 'late' runs only if the second
    # stubborn cell (3 CPU seconds) and three starts took under 1 s together, which no kernel start allows.
    out = worker.execute(nb, timeout=3, path=str(tmp_path), notebook_s=8)
    assert time.monotonic() - start < 25
    assert _texts(out.cells[2])[1] == ["CellTimeoutError"]
    assert "its limit of 3 CPU seconds" in out.cells[2].outputs[-1].evalue
    assert _texts(out.cells[3])[0] == "42\n"  # the points earned elsewhere stay
    assert _texts(out.cells[5])[1] == ["NotebookTimeLimit"]


def _inside(probe: str, limits: sandbox.Limits | None = None) -> subprocess.CompletedProcess:
    if sandbox.unavailable():
        skip_or_fail(f"no sandbox on this machine: {sandbox.unavailable()}")
    cmd = sandbox.sandbox_command(limits or sandbox.Limits()) + [sys.executable, "-c", probe]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_sandbox_has_no_capabilities_and_sees_only_its_allow_list(monkeypatch):
    """Run as whoever runs the tests (root in CI): nothing of the host beyond the allow-list."""
    monkeypatch.setenv("COURSE_TEST_SECRET", "x")
    probe = f"""
import os, subprocess
print("uid", os.getuid(), "gid", os.getgid())
print("caps", sorted({{l.split()[1] for l in open("/proc/self/status") if l.startswith("Cap")}}))
print("seen", [p for p in {[str(ROOT / "solutions"), str(ROOT / "tests"), str(ROOT / ".git"),
                             "/etc/shadow", "/etc/passwd", "/root/.bashrc", "/home", "/var", "/run"]!r}
              if os.path.exists(p)])
print("env", sorted(k for k in os.environ if k not in {sorted(sandbox.PASSED_ENV)!r}))
print("procs", sorted(p for p in os.listdir("/proc") if p.isdigit()) <= ["1", "2", "3", "4"])
for cmd in (["umount", "/proc"], ["mount", "-o", "remount,rw", "/usr"], ["unshare", "-r", "true"]):
    print(cmd[0], subprocess.run(cmd, capture_output=True).returncode != 0)
import course_lib, torch
for target in [course_lib.__file__ + ".x", "/usr/x", "/x"]:
    try:
        open(target, "w")
        print("wrote", target)
    except OSError:
        pass
try:  # refused, or (a checkout under /tmp) written to the sandbox's own /tmp, never the host's
    open({str(ROOT / "x.txt")!r}, "w").write("x")
except OSError:
    pass
open("mine.txt", "w").write("ok")
print("cwd", os.getcwd(), open("mine.txt").read())
"""
    proc = _inside(probe)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "uid 65534 gid 65534", "caps ['0000000000000000']", "seen []",
        "env ['COURSE_ROOT', 'HOME', 'IPYTHONDIR', 'JUPYTER_RUNTIME_DIR', 'LANG', 'LOGNAME', 'MPLCONFIGDIR', "
        "'PATH', 'PWD', 'PYTHONNOUSERSITE', 'USER']",
        "procs True", "umount True", "mount True", "unshare True", f"cwd {sandbox.WORKDIR} ok"]
    assert not (ROOT / "x.txt").exists()


def test_the_writable_places_are_size_limited():
    probe = """
import os
for place in ("/submission/big", "/tmp/big", "/dev/shm/big", "/dev/big"):
    try:
        with open(place, "wb") as f:
            for _ in range(64):
                f.write(b"x" * 2**20)
        print(place, "written")
    except OSError as e:
        print(place, e.strerror)
"""
    proc = _inside(probe, sandbox.Limits(disk_bytes=16 * 2**20))
    assert proc.stdout.splitlines() == ["/submission/big No space left on device",
                                        "/tmp/big No space left on device",
                                        "/dev/shm/big No space left on device",
                                        "/dev/big Read-only file system"], proc.stderr


HOLD = "import os, time\n{}\ntime.sleep(20)\nprint('survived')"
MEMFD = "fd = os.memfd_create('held')\nfor _ in range(40):\n    os.write(fd, b'x' * 2**23)"  # 320 MiB


@pytest.mark.parametrize("code", [
    MEMFD,  # never mapped: in no process's PSS
    "with open('/dev/shm/big', 'wb') as f:\n    for _ in range(40):\n        f.write(b'x' * 2**23)",
    "f = open('/tmp/big', 'wb')\nos.unlink('/tmp/big')\nfor _ in range(40):\n    f.write(b'x' * 2**23)",
])
def test_the_watchdog_counts_memfd_and_every_tmpfs_of_the_sandbox(code):
    """A kernel's child holds 320 MiB outside its PSS, under a 256 MiB limit: stopped, the worker lives."""
    limits = sandbox.Limits(memory_bytes=256 * 2**20, disk_bytes=512 * 2**20)
    worker = (f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {HOLD.format(code)!r}])\n"
              "print('worker lives')")
    if sandbox.unavailable():
        skip_or_fail(f"no sandbox on this machine: {sandbox.unavailable()}")
    proc = subprocess.Popen(sandbox.sandbox_command(limits) + [sys.executable, "-c", worker],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    dog = watchdog.Watchdog(proc.pid, limits, keep=3, tmpfs=sandbox.TMPFS)
    dog.start()
    out, err = proc.communicate(timeout=60)
    dog.done.set()
    assert out == "worker lives\n", err
    assert dog.reasons == ["it used more than 0.25 GiB of memory (processes and files together)"]


def test_held_files_count_memfd_and_deleted_files_once_by_their_pages(tmp_path):
    code = ("import os, sys, tempfile, time\n"
            "fd = os.memfd_create('a'); os.write(fd, b'x' * 2**23); os.dup(fd)\n"  # 8 MiB, two fds
            "sparse = os.memfd_create('b'); os.ftruncate(sparse, 2**30)\n"  # 1 GiB of holes
            f"f = tempfile.TemporaryFile(dir={str(tmp_path)!r}); f.write(b'y' * 2**20); f.flush()\n"
            "print('ready', flush=True); time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        assert watchdog._held_files([proc.pid], ()) == 9 * 2**20
        assert watchdog._held_files([proc.pid, proc.pid], (str(tmp_path),)) == 8 * 2**20  # counted tmpfs
    finally:
        proc.kill()
        proc.wait()
    # Outside the sandbox's mount namespace there is no sandbox tmpfs: never the host's /tmp.
    assert watchdog._tmpfs_used([os.getpid()], ("/tmp",)) == 0


def test_the_process_tree_is_read_the_same_from_the_children_lists_and_from_all_of_proc(monkeypatch):
    """A child forked by a second thread, a grandchild orphaned to the tree's root, a child that
    ended: both readers find the same processes, in order of start, and nothing else."""
    code = ("import os, subprocess, sys, threading, time\n"
            "sleep = [sys.executable, '-c', 'import time; time.sleep(30)']\n"
            "threading.Thread(target=lambda: subprocess.Popen(sleep)).start()\n"
            "if (pid := os.fork()) == 0:\n"
            "    subprocess.Popen(sleep); os._exit(0)\n"
            "os.waitpid(pid, 0)\n"  # its child is orphaned
            "subprocess.run([sys.executable, '-c', 'pass'])\n"
            "time.sleep(1); print('ready', flush=True); time.sleep(30)")
    # the root is a subreaper, as bubblewrap's init is in its pid namespace: orphans stay in the tree
    root = subprocess.Popen([sys.executable, "-c", "import ctypes, os, sys\n"
                             "ctypes.CDLL(None).prctl(36, 1)\n"  # PR_SET_CHILD_SUBREAPER
                             f"os.execv(sys.executable, [sys.executable, '-c', {code!r}])"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert root.stdout.readline() == "ready\n"
        fast = watchdog._tree(root.pid)
        monkeypatch.setattr(watchdog, "_children_listed", lambda: False)
        assert sorted(fast) == sorted(watchdog._tree(root.pid))  # (siblings of one tick in either order)
        assert fast[0] == root.pid and len(fast) == 3  # the root, the thread's child, the orphan
    finally:
        for pid in reversed(watchdog._tree(root.pid)):
            watchdog._kill(pid)
        root.wait()


@pytest.mark.parametrize("limit, code, reason", [
    (sandbox.Limits(processes=20), "import os, time\nfor _ in range(60):\n    if os.fork() == 0:\n"
     "        time.sleep(30); os._exit(0)\ntime.sleep(30)", "more than 20 processes"),
    (sandbox.Limits(memory_bytes=300 * 2**20), "import os, time\nkids = [os.fork() for _ in range(2)]\n"
     "b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096])\ntime.sleep(30)", "more than 0.29"),
])
def test_the_watchdog_counts_the_whole_tree_and_spares_the_worker(limit, code, reason):
    """A worker (here a plain python) whose children pass a limit together: they die, it lives."""
    proc = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys\n"
                             f"subprocess.run([sys.executable, '-c', {code!r}])\nprint('worker lives')"],
                            stdout=subprocess.PIPE, text=True)
    dog = watchdog.Watchdog(proc.pid, limit, keep=1)
    dog.start()
    out, _ = proc.communicate(timeout=60)
    dog.done.set()
    assert out == "worker lives\n"
    assert len(dog.reasons) == 1 and reason in dog.reasons[0]  # one per episode, not per check


def test_grading_refuses_without_a_sandbox_unless_allowed(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "unavailable", lambda: "bubblewrap (bwrap) is not installed")
    nb = notebook.read(config.student_path(CHAPTERS[0]))  # untouched: every exercise fails
    nb.cells.append(nbformat.v4.new_code_cell("print(6 * 7)"))
    with pytest.raises(RuntimeError, match="refusing to grade: bubblewrap"):
        sandbox.SandboxedExecute(timeout=10).preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    step = sandbox.SandboxedExecute(timeout=10, allow_unsandboxed=True)
    out, _ = step.preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    assert _texts(out.cells[-1])[0] == "42\n"
    for ex in notebook.exercises(out):
        assert "NotImplementedError" in out.cells[ex.test_cell].outputs[0].evalue


STRAYS = "sum('stray-{}' in open(f'/proc/{{p}}/cmdline').read() for p in os.listdir('/proc') if p.isdigit())"


@pytest.mark.parametrize("attack", [
    # children that outlive their kernel, below every limit
    "import os, subprocess, sys, time\nfor _ in range(20):\n    subprocess.Popen([sys.executable, '-c', "
    "'import time; time.sleep(60)', 'stray-{}'])\ntime.sleep(1)\nos._exit(1)",
    # a fork bomb: the watchdog kills the kernel, and the next kernel must start all the same
    "import os, sys, time\nfor _ in range(150):\n    if os.fork() == 0:\n"
    "        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', 'stray-{}'])\n"
    "time.sleep(30)",
])
def test_after_a_kernel_dies_what_it_left_is_ended_before_the_next_kernel_runs(tmp_path, attack):
    if sandbox.unavailable():
        skip_or_fail(f"no sandbox on this machine: {sandbox.unavailable()}")
    marker = f"{time.monotonic_ns()}"
    nb = _notebook(attack.format(marker), f"import os\nprint(base + 1, {STRAYS.format(marker)})",
                   setup=["base = 41"])
    out, _ = sandbox.SandboxedExecute(timeout=40).preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    assert _texts(out.cells[2])[1] == ["DeadKernelError"], out.cells[2].outputs
    assert _texts(out.cells[3])[0] == "42 0\n", out.cells[3].outputs


class _Kernels:
    """A notebook client whose first ``failures`` kernels die while starting."""

    def __init__(self, failures: int):
        self.failures, self.starts = failures, 0

    @contextlib.contextmanager
    def setup_kernel(self, **_):
        self.starts += 1
        if self.starts <= self.failures:
            raise RuntimeError("Kernel died before replying to kernel_info")
        yield


def test_a_kernel_that_dies_while_starting_is_tried_three_times(monkeypatch):
    monkeypatch.setattr(worker.time, "sleep", lambda s: None)
    kernels = _Kernels(failures=2)
    with worker._start_kernel(kernels, env={}, sandboxed=False):
        assert kernels.starts == 3
    with pytest.raises(RuntimeError, match="kernel_info"):
        worker._start_kernel(_Kernels(failures=3), env={}, sandboxed=False)


def test_when_no_kernel_starts_every_cell_says_so_and_the_worker_still_answers(tmp_path, monkeypatch):
    spec = tmp_path / "kernels" / "dead"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-c", "raise SystemExit(1)", "{connection_file}"],
        "display_name": "dead", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    monkeypatch.setattr(worker.time, "sleep", lambda s: None)
    out = worker.execute(_notebook("print(1)", "print(2)"), timeout=20, path=str(tmp_path),
                          kernel_name="dead")
    assert [_texts(c)[1] for c in out.cells] == [["KernelStartError"]] * 3
    explained = sandbox._explain_deaths(out, ["it started more than 64 processes"])
    assert "more than 64 processes" in explained.cells[0].outputs[0].evalue


def test_only_outputs_come_back_from_the_worker_and_never_points_or_cells():
    """A notebook written by anything in the sandbox (a kernel that reached the worker's output)
    decides at most the outputs of the student's own cells."""
    submitted = _notebook("print(1)", "x = 2")
    test = nbformat.v4.new_code_cell("assert f(1) == 1")
    test.metadata["nbgrader"] = {"grade": True, "grade_id": "ex_test", "points": 2, "solution": False}
    submitted.cells.append(test)
    forged = json.loads(nbformat.writes(submitted))
    for cell in forged["cells"]:
        cell["source"] = "forged"
        cell.setdefault("metadata", {})["nbgrader"] = {"grade": True, "grade_id": "ex_test", "points": 1000}
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["all tests ", "passed"]},
                           {"output_type": "display_data", "data": {"text/html": "<b>hi</b>", 3: "x"},
                            "metadata": {"evil": True}},
                           {"output_type": "error", "ename": "E", "evalue": 5, "traceback": ["t", None]},
                           {"output_type": "unknown"}, "not an output"]
        cell["execution_count"] = "7"
    forged["cells"].append(dict(forged["cells"][-1]))  # an invented cell
    tests = {len(submitted.cells) - 1}
    executed, note = sandbox._with_outputs(submitted, json.dumps(forged), tests)
    assert note is None and len(executed.cells) == len(submitted.cells)
    for mine, theirs in zip(executed.cells, submitted.cells, strict=True):
        assert (mine.source, mine.metadata) == (theirs.source, theirs.metadata)
    assert executed.cells[-1].outputs == []  # a test cell's output is the verdict's, set later
    assert executed.cells[1].outputs == [
        nbformat.v4.new_output("stream", name="stdout", text="all tests passed"),
        nbformat.v4.new_output("display_data", data={"text/html": "<b>hi</b>"}),
        nbformat.v4.new_output("error", ename="E", evalue="", traceback=["t", ""])]
    assert executed.cells[1].execution_count is None
    nbformat.validate(executed)
    huge = json.loads(nbformat.writes(submitted))
    huge["cells"][1]["outputs"] = [{"output_type": "error", "ename": "ValueError", "evalue": "x" * 10**6,
                                    "traceback": ["x" * 10**6]}]
    (out,) = sandbox._with_outputs(submitted, json.dumps(huge), tests)[0].cells[1].outputs
    assert len(out.evalue) < 101_000 and out.evalue.endswith("[900,000 more characters not kept]")
    executed, note = sandbox._with_outputs(submitted, "{not json", tests)
    assert "no readable notebook" in note and all(c.get("outputs", []) == [] for c in executed.cells)


def test_a_failed_exercise_that_makes_a_known_mistake_says_so_and_the_report_names_it():
    nb = _notebook()
    for name in ("ex_a", "ex_b", "ex_c"):
        test = nbformat.v4.new_code_cell("")
        test.metadata["nbgrader"] = {"grade": True, "grade_id": name + config.TEST_SUFFIX, "points": 1}
        nb.cells.append(test)
    key = [{"kind": "equal", "what": "f(2)", "expected": 4, "params": {}}]
    known = {name: [{"why": "adds instead of multiplying", "hint": "Look at the operator.",
                     "record": {"checks": [{"kind": "equal", "actual": 3}], "error": None}}]
             for name in ("ex_a", "ex_b", "ex_c")}
    results = {"ex_a": {"checks": [{"kind": "equal", "what": "f(2)", "actual": 3}], "error": None},
               "ex_b": {"checks": [{"kind": "equal", "what": "f(2)", "actual": 5}], "error": None},
               "ex_c": {"checks": [], "error": "NotImplementedError:  (raised at line 2 of the answer)"}}
    report = sandbox._judge_cells(nb, dict.fromkeys(results, key), results, None, [], known=known)
    assert report["mistakes"] == {"ex_a": "adds instead of multiplying", "ex_b": "", "ex_c": None}
    outs = [c.outputs[0] for c in nb.cells[-3:]]
    assert outs[0].evalue.endswith("\nThis looks like a known mistake: Look at the operator.")
    assert mistakes.LEAD not in outs[1].evalue + outs[2].evalue


@pytest.mark.parametrize("fail_borrowed", [False, True])
def test_a_borrowed_reference_is_flagged_or_failed_as_the_instructor_chose(fail_borrowed):
    nb = _notebook()
    test = nbformat.v4.new_code_cell("")
    test.metadata["nbgrader"] = {"grade": True, "grade_id": "ex_a" + config.TEST_SUFFIX, "points": 1}
    nb.cells.append(test)
    event = "called course_lib's course_lib.m.a, this exercise's reference in the graded run"
    report = sandbox._judge_cells(nb, {"ex_a": []},
                                  {"ex_a": {"checks": [], "error": None, "events": [event]}},
                                  None, [], fail_borrowed=fail_borrowed)
    assert report["flags"] == [f"ex_a: {event}"]
    (out,) = test.outputs
    if fail_borrowed:
        assert out.output_type == "error" and "runs course_lib's own reference" in out.evalue
    else:
        assert out.text == "ex_a: all tests passed\n"
