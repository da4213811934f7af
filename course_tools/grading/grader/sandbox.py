"""Execute a submission for grading so that no submission can escape, stall, break the class or
decide its own verdict.

**Grader side**: runs in the grader's own process, never beside student code.

nbgrader's autograder is configured (``nbgrader_config.py``) to execute notebooks with
:class:`SandboxedExecute` instead of its own ``Execute``. A submission then runs twice, each time
in a new sandbox, and no file holding hidden tests or answer keys is ever visible to its code:

1. the notebook goes to a worker process on standard input and comes back executed on standard
   output, for the feedback and the formgrader: every cell but the test cells (and the chapter's
   unchanged demonstrations) in one kernel;
2. each exercise's graded run (:mod:`course_tools.grading.grader.verdicts`): the set-up cells, that answer
   and its tests without their references, in a fresh process, recording data; the records are
   judged here against the chapter's answer key, and each test cell gets the verdict as its
   only output.

On Linux the worker runs in a bubblewrap sandbox that holds as root and as an ordinary user:

- a new user namespace with uid and gid 65534 and every capability dropped (``--cap-drop ALL``),
  no nested user namespaces, a new session, and new pid, network, IPC, UTS and cgroup
  namespaces: no host process, socket or network is reachable, and nothing can be remounted;
- an allow-list of read-only binds: the system libraries (``/usr`` and its links), a few files
  of ``/etc`` the dynamic linker needs, the Python installation and environment, ``course_lib``
  and ``_config.yml``. The rest of the host (``solutions/``, ``tests/``, the grading folder,
  other checkouts, ``/root``, ``/etc/shadow``) does not exist inside;
- a clean environment (``--clearenv``), a private ``/proc`` and ``/dev``;
- only three writable places, all size-limited tmpfs: the working folder ``/submission`` (a copy
  of nothing: the notebook arrives on stdin), ``/tmp`` and ``/dev/shm`` (the rest of ``/dev`` is
  read-only).

Limits hold for the whole submission, not per process (:class:`Limits`): a watchdog outside the
sandbox adds up the memory of all its processes, its tmpfs and the deleted files they hold open
(memfd files too), counts its processes and their CPU time, and kills the kernel's processes
when one limit is passed; the worker records that cell as failed with the reason, starts a new
kernel and goes on. Each cell has the course's per-cell limit, in CPU seconds of the kernel's
process tree with a wall clock five times longer as a backstop (:mod:`.work_limit`: a busy grading
server stops the same cells as a quiet one), and the notebook one wall-clock limit
(``Limits.notebook_s``) that does not grow with the number of cells: a cell that ignores
interrupts is killed at its limit, cells not reached by the notebook's limit are marked so, and
the student keeps the points earned elsewhere. When the sandbox ends every process in it ends
(pid namespace, ``--die-with-parent``).

Where bubblewrap is missing or cannot create the sandbox (no user namespaces, not Linux),
grading refuses to run and says why, unless the instructor allows unsandboxed grading
explicitly (``--unsandboxed``; ``SandboxedExecute.allow_unsandboxed``).

The chapter's demonstrations that the submission left unchanged (training runs, figures:
:func:`course_tools.notebook.unchanged_demonstrations`, decided outside the sandbox from the
released chapter) are not run, as in the students' self-check, and say so in their output; every
set-up, graded, added or changed cell runs (``all_cells`` runs every cell).

How the notebook's run survives errors, timeouts and kernel deaths is :mod:`worker`'s.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Bool, Enum, Integer, Unicode

from course_tools import config, notebook
from course_tools.grading.grader import failures, mistakes, verdicts
from course_tools.grading.grader.watchdog import Watchdog, _kill, _tree
from course_tools.grading.sandboxed import graded_run, guard, worker
from course_tools.grading.sandboxed.worker import error_output

WORKDIR = "/submission"  # the sandbox's working folder, a size-limited tmpfs
TMPFS = (WORKDIR, "/tmp", "/dev/shm")  # every place a submission can write, each a size-limited tmpfs
NOBODY = "65534"
# Variables a submission may see: the thread and CPU-kernel settings the graders are tested under.
PASSED_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
              "ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "COURSE_CELL_TIMEOUT", "TZ")
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "fonts", "localtime")


@dataclass(frozen=True)
class Limits:
    """What one submission may use, all its processes and files together."""

    notebook_s: int = worker.NOTEBOOK_S  # wall clock for the whole notebook, however many cells
    memory_bytes: int = 6 * 2**30   # memory of every process, the tmpfs, memfd and deleted files
    processes: int = 64             # kernel, worker and anything they start
    disk_bytes: int = 512 * 2**20   # each of the TMPFS
    cpu_s: int = 1800               # CPU time of all processes (a busy kernel uses several cores)
    output_bytes: int = 256 * 2**20  # what the grader reads back from a sandbox


_TOOLS = Path(__file__).resolve().parents[2]  # course_tools
# the code a sandbox may read: the reference library, and of the tooling only what runs inside (a
# notebook's runtime and the graded run), not the grader, its keys, or the catalogues' answers
SANDBOXED_CODE = (_TOOLS.parent / "course_lib", _TOOLS / "__init__.py", _TOOLS / "config.py",
                  _TOOLS / "notebook.py", _TOOLS / "student", _TOOLS / "grading" / "__init__.py",
                  _TOOLS / "grading" / "sandboxed")


def bwrap_available() -> bool:
    return sys.platform.startswith("linux") and shutil.which("bwrap") is not None


def _readable() -> list[tuple[str, str]]:
    """The allow-list: (kind, path) with kind "bind" (read-only) or "link" (a symlink to recreate)."""
    out = []
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            out.append(("link", top))
        elif os.path.isdir(top):
            out.append(("bind", top))
    out += [("bind", f"/etc/{name}") for name in ETC if os.path.exists(f"/etc/{name}")]
    root = config.root()
    paths = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), root / "_config.yml",
             *SANDBOXED_CODE}
    return out + [("bind", str(p)) for p in sorted(paths) if p.exists()]


def sandbox_command(limits: Limits = Limits()) -> list[str]:
    """The bubblewrap command line that confines a worker (see the module docstring)."""
    cmd = ["bwrap", "--unshare-all", "--unshare-user", "--uid", NOBODY, "--gid", NOBODY,
           "--disable-userns", "--cap-drop", "ALL", "--die-with-parent", "--new-session",
           "--clearenv", "--proc", "/proc", "--dev", "/dev"]
    # Before the binds: a checkout under /tmp is bound over the tmpfs. /dev itself is a tmpfs
    # of half the host's memory that bubblewrap leaves writable: read-only but for /dev/shm.
    for place in TMPFS:
        cmd += ["--size", str(limits.disk_bytes), "--tmpfs", place]
    cmd += ["--remount-ro", "/dev"]
    for kind, path in _readable():
        cmd += ["--symlink", os.readlink(path), path] if kind == "link" else ["--ro-bind", path, path]
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": WORKDIR,
           "USER": "student", "LOGNAME": "student", "LANG": "C.UTF-8", "PYTHONNOUSERSITE": "1",
           "MPLCONFIGDIR": "/tmp/matplotlib", "JUPYTER_RUNTIME_DIR": "/tmp/jupyter",
           "IPYTHONDIR": "/tmp/ipython", "COURSE_ROOT": str(config.root())}
    env |= {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    # The root is bubblewrap's own tmpfs, where it made the folders of the binds: read-only too.
    return cmd + ["--remount-ro", "/", "--chdir", WORKDIR]


@functools.cache
def unavailable() -> str | None:
    """Why no safe sandbox can be made on this machine, or None when it can (checked once)."""
    if not sys.platform.startswith("linux"):
        return f"sandboxed grading needs Linux (this is {sys.platform})"
    if not bwrap_available():
        return "bubblewrap (bwrap) is not installed (Debian and Ubuntu: apt-get install bubblewrap)"
    probe = ("import os; print(os.getuid(), *sorted({int(l.split()[1], 16) for l in "
             "open('/proc/self/status') if l.startswith('Cap')}))")
    try:
        proc = subprocess.run(sandbox_command() + [sys.executable, "-c", probe], capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "bubblewrap did not start within 60 s"
    # CapInh, CapPrm, CapEff, CapBnd and CapAmb must all be empty.
    if proc.returncode != 0 or proc.stdout.split() != [NOBODY, "0"]:
        return ("bubblewrap cannot create a sandbox without capabilities here (user namespaces "
                f"may be disabled): {proc.stderr.strip()[-300:] or proc.stdout.strip()}")
    return None


@functools.cache
def _bound() -> tuple[str, ...]:
    """The read-only binds of the sandbox (the allow-list does not change while grading)."""
    return tuple(path for kind, path in _readable() if kind == "bind")


class SandboxedExecute(NbGraderPreprocessor):
    """nbgrader preprocessor: execute the notebook in a sandboxed worker process."""

    timeout = Integer(0, help="Seconds per cell; 0 means the course's execute.timeout").tag(config=True)
    notebook_timeout = Integer(Limits.notebook_s, help="Seconds for the whole notebook").tag(config=True)
    memory_limit = Integer(Limits.memory_bytes, help="Bytes for all processes and files").tag(config=True)
    allow_unsandboxed = Bool(False, help="Grade without a sandbox where none can be made").tag(config=True)
    all_cells = Bool(False, help="Also run the chapter's unchanged demonstrations").tag(config=True)

    answer_keys = Unicode("", help="Folder where the chapters' answer keys are kept ('': made each time)"
                          ).tag(config=True)
    report_dir = Unicode("", help="Folder for each student's report (flags, notes) as JSON").tag(config=True)
    borrowed_reference = Enum(["flag", "fail"], "flag", help=(
        "An answer that runs course_lib's own reference of its exercise: 'flag' it for a person "
        "(the points stand) or 'fail' the exercise")).tag(config=True)

    def preprocess(self, nb, resources):
        per_cell = self.timeout or config.cell_timeout()
        # The variables override the configuration for one run (tests use small limits).
        limits = Limits(notebook_s=int(os.environ.get("COURSE_NOTEBOOK_TIMEOUT") or self.notebook_timeout),
                        memory_bytes=int(os.environ.get("COURSE_SANDBOX_MEMORY") or self.memory_limit))
        why = unavailable()
        if why is not None and not self.allow_unsandboxed:
            raise RuntimeError(f"refusing to grade: {why}. Pass --unsandboxed to grade without a "
                               "sandbox, only for submissions you trust.")
        if why is not None:
            self.log.warning("grading WITHOUT a sandbox (allowed explicitly): %s", why)
        chapter = _chapter(nb, resources)
        keys = Path(self.answer_keys) if self.answer_keys else None
        key = {} if chapter is None else verdicts.answer_key(chapter, keys)
        try:  # made once by grade, before the students (not per student: without a folder, none)
            known = {} if chapter is None or keys is None else mistakes.key(chapter, keys)
        except Exception as e:  # noqa: BLE001
            self.log.warning("no known mistakes will be named: %s: %s", type(e).__name__, e)
            known = {}
        # 1. The notebook for feedback and manual grading: every cell but the tests (their outputs
        # are the verdicts) and, unless all_cells, the chapter's unchanged demonstrations. The
        # worker gets the test cells empty (it never runs them: no hidden test enters its sandbox),
        # and only the outputs of the cells it ran come back from it (:func:`_with_outputs`).
        tests = {i for i, c in enumerate(nb.cells)
                 if c.cell_type == "code" and notebook.nbgrader_meta(c).get("grade")}
        skip = tests | (set() if self.all_cells else notebook.unchanged_demonstrations(nb))
        command = [sys.executable, "-m", "course_tools.grading.sandboxed.worker", "--timeout", str(per_cell),
                   "--notebook-timeout", str(limits.notebook_s), "--memory", str(limits.memory_bytes),
                   # unsandboxed, RLIMIT_NPROC would count the instructor's own processes
                   "--processes", str(limits.processes if why is None else 0)]
        command += ["--skip", ",".join(map(str, sorted(skip)))] if skip else []
        sent = copy.deepcopy(nb)
        for i in tests:
            sent.cells[i].source = ""
        out, failure, reasons = _confined(command + ["--sandboxed"] * (why is None), nbformat.writes(sent),
                                          limits, sandboxed=why is None,
                                          cwd=resources.get("metadata", {}).get("path"))
        executed, unreadable = _with_outputs(nb, None if failure else out, tests)
        executed = _explain_deaths(executed, reasons)
        # 2. The graded runs: each exercise's set-up, answer and tests in a fresh process of a new
        # sandbox, recording data; judged here against the answer key. Their own wall clock: what
        # the notebook's run took for feedback never costs a grade. The runner is the sandbox's
        # init, which no answer can signal, read or write through (:mod:`harden`).
        results, run_failure, reasons = {}, "this notebook is none of the course's chapters", []
        release = None
        if chapter is not None:
            release = notebook.read(config.solution_path(chapter))
            req = verdicts.request(release, answers=_answers(nb))
            out, run_failure, reasons = _confined(
                [sys.executable, "-I", "-m", graded_run.__name__, "run", str(limits.notebook_s)],
                json.dumps(req), limits, sandboxed=why is None, cwd=None, as_init=True)
            try:
                results = json.loads(out) if not run_failure else {}
                results = results if isinstance(results, dict) else {}
            except ValueError:
                results, run_failure = {}, "the graded runs sent back no readable result"
        report = _judge_cells(executed, key, results, run_failure, reasons, release,
                              fail_borrowed=self.borrowed_reference == "fail", known=known)
        report["notes"] += [unreadable] if unreadable else []
        _write_report(self.report_dir, resources, report)
        return executed, resources


def _chapter(nb, resources) -> str | None:
    """The chapter ``nb`` is a submission of: nbgrader's assignment, else the one whose exercises it
    has (None: no chapter's, and no test cell can earn points)."""
    name = (resources.get("nbgrader") or {}).get("assignment")
    if name in config.chapters():
        return name
    found = {notebook.nbgrader_meta(c).get("grade_id") for c in nb.cells}
    for chapter in config.chapters():
        if {ex.name for ex in notebook.exercises(notebook.read(config.solution_path(chapter)))} & found:
            return chapter
    return None


def _answers(nb) -> dict[str, str]:
    """Each exercise's answer cell in the submission (the first cell with its grade id)."""
    out: dict[str, str] = {}
    for cell in nb.cells:
        meta = notebook.nbgrader_meta(cell)
        if cell.cell_type == "code" and meta.get("solution") and not meta.get("grade"):
            out.setdefault(meta.get("grade_id", ""), cell.source)
    return out


def _confined(cmd: list[str], stdin: str, limits: Limits, sandboxed: bool, cwd: str | None,
              as_init: bool = False) -> tuple[str, str | None, list[str]]:
    """Run ``cmd`` in a new sandbox (or, unsandboxed, in ``cwd``) under ``limits`` watched from here;
    returns its standard output (at most ``limits.output_bytes``), why it failed (or None) and the
    limits it passed. ``as_init``: ``cmd`` is the sandbox's init (pid 1), the process no other in
    the sandbox can signal; it must reap what it starts."""
    if sandboxed:
        # kept alive by the watchdog: bubblewrap, its init (unless cmd is the init), the process
        init = ["--as-pid-1"] if as_init else []
        cmd, keep, tmpfs, cwd = sandbox_command(limits) + init + cmd, 2 if as_init else 3, TMPFS, "/"
    else:
        keep, tmpfs = 1, ()
    wall = limits.notebook_s + 120  # the process stops itself at notebook_s; this is a backstop
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=cwd or tempfile.gettempdir(), start_new_session=True)
    watchdog = Watchdog(proc.pid, limits, keep, tmpfs, _bound() if sandboxed else ())
    watchdog.start()
    try:
        out, err, why = _exchange(proc, stdin.encode(), limits.output_bytes, wall)
    finally:
        watchdog.done.set()
        for pid in reversed(_tree(proc.pid)):
            _kill(pid)
        proc.wait()
    if why is not None:
        return "", f"the grading process failed: {why}", watchdog.reasons
    out_text, err_text = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    if proc.returncode != 0 and not out_text.strip():
        why = failures.failure_cause(err_text, config.root()) if err_text.strip() else \
            f"exit status {proc.returncode}"
        return "", f"the grading process failed: {why}", watchdog.reasons
    return out_text, None, watchdog.reasons


def _exchange(proc: subprocess.Popen, data: bytes, cap: int, wall: float) -> tuple[bytes, bytes, str | None]:
    """Send ``data`` to ``proc`` and read what it writes until it closes its output: at most ``cap``
    bytes of standard output (more fails) and the last MiB of its errors, for at most ``wall``
    seconds. Returns (output, errors, why it failed or None)."""
    out, err, over = bytearray(), bytearray(), threading.Event()

    def feed():
        with contextlib.suppress(OSError):  # a process that stops reading
            proc.stdin.write(data)
            proc.stdin.close()

    def drain(stream, buf: bytearray, keep_tail: bool):
        while chunk := stream.read1(1 << 16):
            buf += chunk
            if keep_tail and len(buf) > 2**20:
                del buf[:len(buf) - 2**20]
            elif not keep_tail and len(buf) > cap:
                over.set()
                return

    reader = threading.Thread(target=drain, args=(proc.stdout, out, False), daemon=True)
    threads = [threading.Thread(target=feed, daemon=True), reader,
               threading.Thread(target=drain, args=(proc.stderr, err, True), daemon=True)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + wall
    while reader.is_alive() and time.monotonic() < deadline:
        reader.join(0.2)
    if over.is_set():
        return b"", bytes(err), f"it sent back more than {cap / 2**20:g} MiB"
    if reader.is_alive():
        return b"", bytes(err), f"grading stopped after {wall} s"
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(max(1.0, deadline - time.monotonic()))
    return bytes(out), bytes(err), None


OUTPUT_TYPES = {"stream", "display_data", "execute_result", "error"}
MAX_DATA_CHARS = 2_000_000  # a figure as base64 (the worker keeps about MAX_OUTPUT_CHARS of text)


def _with_outputs(nb, returned: str | None, tests: set[int]):
    """``nb``, the submission as nbgrader graded it, with the outputs of its code cells taken from
    the notebook the worker ``returned`` (None: none came back), and a note if it was unreadable.

    Everything else (the cells, their sources, metadata and points) is ``nb``'s, and the outputs
    are rebuilt field by field from plain strings: whatever in the sandbox wrote the notebook
    (the worker, or a kernel that reached its output) decides at most the outputs of the
    student's own code. The test cells get theirs from the verdicts (:func:`_judge_cells`)."""
    executed = copy.deepcopy(nb)
    ran, note = [], None
    if returned is not None:
        try:
            ran = json.loads(returned)["cells"]
        except (ValueError, TypeError, KeyError):
            note = "the run of the cells for feedback sent back no readable notebook"
    ran = ran if isinstance(ran, list) else []
    for i, cell in enumerate(executed.cells):
        if cell.cell_type != "code" or i in tests:
            continue
        mine = ran[i] if i < len(ran) and isinstance(ran[i], dict) else {}
        outputs = mine.get("outputs") if isinstance(mine.get("outputs"), list) else []
        cell.outputs = [o for o in map(_clean_output, outputs) if o is not None]
        count = mine.get("execution_count")
        cell.execution_count = count if isinstance(count, int) and not isinstance(count, bool) else None
    return executed, note


def _text(value, limit: int = worker.MAX_OUTPUT_CHARS) -> str:
    """A notebook string field (a string or a list of lines) as one string of at most ``limit``
    characters, and a note of what was cut; anything else empty. (The worker keeps errors whole:
    they may decide points in a test cell, and a 50 MB message elsewhere is cut here.)"""
    if isinstance(value, list):
        value = "".join(v for v in value if isinstance(v, str))
    if not isinstance(value, str):
        return ""
    return value if len(value) <= limit else \
        value[:limit] + f"\n[{len(value) - limit:,} more characters not kept]"


def _clean_output(out):
    """A worker's output rebuilt from its known fields, or None for anything that is not one."""
    if not isinstance(out, dict) or out.get("output_type") not in OUTPUT_TYPES:
        return None
    kind = out["output_type"]
    if kind == "stream":
        name = out.get("name") if out.get("name") in ("stdout", "stderr") else "stdout"
        return nbformat.v4.new_output("stream", name=name, text=_text(out.get("text")))
    if kind == "error":
        trace = out.get("traceback") if isinstance(out.get("traceback"), list) else []
        return nbformat.v4.new_output("error", ename=_text(out.get("ename")), evalue=_text(out.get("evalue")),
                                      traceback=[_text(line) for line in trace])
    data = out.get("data") if isinstance(out.get("data"), dict) else {}
    data = {mime: _text(value, MAX_DATA_CHARS) for mime, value in data.items()
            if isinstance(mime, str) and "/" in mime}
    if kind == "execute_result":
        count = out.get("execution_count")
        return nbformat.v4.new_output(kind, data=data,
                                      execution_count=count if isinstance(count, int) else None)
    return nbformat.v4.new_output(kind, data=data)


def _judge_cells(nb, key: dict, results: dict, failure: str | None, reasons: list[str], release=None,
                 fail_borrowed: bool = False, known: dict | None = None) -> dict:
    """Put each exercise's verdict in its test cell (the only output a test cell has), with the
    points of the ``release`` (the instructor's notebook), and return the report: flags from the
    graded runs, notes on limits reached and, per failed exercise, the known mistake it makes
    (its ``why``; "" for none, None for an exercise not answered), named from the mistake key
    ``known`` (:mod:`.mistakes`). ``fail_borrowed``: an answer that ran its exercise's course_lib
    reference fails (else it is flagged only)."""
    flags, notes, failed = [], [], {}
    for cell in nb.cells:  # a graded cell that no exercise of the key pairs with earns nothing
        if cell.cell_type == "code" and notebook.nbgrader_meta(cell).get("grade"):
            why = failure or "not an exercise"
            cell.outputs = [error_output("GradingError", f"no answer key for this cell: {why}")]
    cells = {notebook.nbgrader_meta(c).get("grade_id"): c for c in nb.cells
             if c.cell_type == "code" and notebook.nbgrader_meta(c).get("grade")}
    released = {} if release is None else {ex.name: ex for ex in notebook.exercises(release)}
    for name in key:
        cell = cells.get(name + config.TEST_SUFFIX)
        if cell is None:
            continue
        if name in released:
            notebook.nbgrader_meta(cell)["points"] = released[name].points
        result = results.get(name)
        if not isinstance(result, dict):
            result = {"checks": [], "error": failure or "no result came back from the graded run"}
        elif reasons and "killed" in str(result.get("error")):
            result["error"] = f"{result['error']}; the last limit the submission passed: {reasons[-1]}"
        events = result.get("events") if isinstance(result.get("events"), list) else []
        problem = verdicts.judge(key[name], result)
        borrowed = [e for e in events if isinstance(e, str) and e.endswith(guard.BORROWED)]
        if problem is None and fail_borrowed and borrowed:
            problem = (f"the answer runs course_lib's own reference of this exercise ({borrowed[0]}); "
                       "write it yourself")
        if problem is not None and name in released:
            problem = _scrubbed(problem, release.cells[released[name].test_cell].source)
        if problem is not None:
            unanswered = str(result.get("error")).startswith("NotImplementedError")
            mistake = None if unanswered else mistakes.name(key[name], (known or {}).get(name, []), result)
            failed[name] = None if unanswered else mistake["why"] if mistake else ""
            problem += f"\n{mistakes.hint_line(mistake)}" if mistake else ""
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"{name}: all tests passed\n")
                        ] if problem is None else [error_output("AssertionError", problem)]
        flags += [f"{name}: {event}" for event in events[:10] if isinstance(event, str)]
        if "time limit" in str(result.get("error")) or "ran past" in str(result.get("error")):
            notes.append(f"{name}: {str(result.get('error'))[:200]}")
    if any(o.get("ename") == "NotebookTimeLimit" for c in nb.cells if c.cell_type == "code"
           for o in c.get("outputs", [])):
        notes.append("the notebook's time limit stopped the run of its cells for feedback")
    return {"flags": flags, "notes": notes, "mistakes": failed}


MAX_PROBLEM_CHARS = 2000


def _scrubbed(problem: str, tests: str) -> str:
    """A verdict's words as the student may see them: no line of the test cell's code (hidden tests
    included) however the graded run sent it back, and at most ``MAX_PROBLEM_CHARS``. A check's
    own description, which the key wrote, is kept."""
    for line in sorted({line.strip() for line in tests.splitlines()}, key=len, reverse=True):
        if len(line) >= 12 and line in problem:
            problem = problem.replace(line, "[test code]")
    if len(problem) > MAX_PROBLEM_CHARS:
        problem = problem[:MAX_PROBLEM_CHARS] + f" ... [{len(problem) - MAX_PROBLEM_CHARS} more characters]"
    return problem


def _write_report(folder: str, resources, report: dict) -> None:
    student = (resources.get("nbgrader") or {}).get("student")
    if folder and student:
        path = Path(folder) / f"{student}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        # ASCII with escapes: a student's lone surrogate cannot make the file unreadable
        tmp.write_text(json.dumps(report, ensure_ascii=True), encoding="utf-8")
        tmp.replace(path)


def _explain_deaths(nb, reasons: list[str]):
    """Say in each cell whose kernel the watchdog killed which limit the submission passed.

    The watchdog kills with SIGKILL, so its kills are the deaths the worker saw as "killed", in
    the same order (a crash or ``os._exit`` in between is not one of them)."""
    killed = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error" and o.get("ename") == "DeadKernelError"
              and "(killed)" in o.get("evalue", "")]
    for out, reason in zip(killed, reasons, strict=False):
        out.evalue = f"the kernel was stopped in this cell: {reason}"
        out.traceback = [f"DeadKernelError: {out.evalue}; a new kernel ran the cells after it."]
    unstarted = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                 if o.get("ename") == "KernelStartError"]
    if unstarted and reasons:  # a limit still passed may be why
        unstarted[0].evalue += f"; the last limit the submission passed: {reasons[-1]}"
        unstarted[0].traceback = [f"KernelStartError: {unstarted[0].evalue}"]
    return nb
