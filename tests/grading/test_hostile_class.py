"""A hostile class graded by the real workflow, as the user CI runs as (root in CI's container):
``make collect``, ``make grade``, ``make export``, then ``make grade`` again.

The export (``tests/hostile_class.py``) holds honest students with awkward names and files,
broken notebooks, cheats and attacks on the machine. Every student's points, problems, notes
and flags are asserted exactly, and so is what the attacks must not have done: nothing outside
the grading folder changed (the repository, ``.venv``, ``/tmp``), no process outlives grading, no
feedback holds a hidden test or a student's script, and a second grading gives the same rows.

Run as root, the attacks that depend on privilege are graded once more by an ordinary user (uid
65534 and no capabilities, in a user namespace), for whom bubblewrap itself runs unprivileged.
"""

from __future__ import annotations

import csv
import hashlib
import html as htmllib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from course_tools import config, notebook
from course_tools.grading.grader import sandbox
from tests import hostile_class
from tests.conftest import ROOT, skip_or_fail

CHAPTER = hostile_class.CHAPTER
# 10 CPU seconds a cell (ample for chapter 02, however busy the machine): the student whose cell
# sleeps and ignores interrupts is stopped by the wall-clock backstop, five times that.
ENV = {"COURSE_CELL_TIMEOUT": "10", "COURSE_SANDBOX_MEMORY": str(2 * 2**30)}


def _make(target: str, grading: Path, *args: str, prefix: tuple[str, ...] = (),
          env: dict | None = None) -> str:
    env = {**os.environ, **ENV, "COURSE_TEST_SECRET": "do-not-leak", **(env or {})}
    proc = subprocess.run([*prefix, "make", "-o", ".venv/.installed", target, f"CHAPTER={CHAPTER}",
                           f"GRADING={grading}", f"PY={sys.executable}", *args],
                          cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _rows(grading: Path) -> dict[str, dict]:
    with (grading / "grades" / f"{CHAPTER}.csv").open(encoding="utf-8") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def _fingerprint() -> dict[str, str]:
    """Contents of the repository's files, metadata of every file in .venv, names in /tmp."""
    out = {}
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        path = ROOT / name
        if path.is_file():
            out[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    for base, dirs, files in os.walk(sys.prefix):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            st = os.lstat(os.path.join(base, name))
            out[os.path.join(base, name)] = f"{st.st_size} {st.st_mtime_ns} {st.st_mode}"
    out["/tmp"] = " ".join(sorted(n for n in os.listdir("/tmp") if not n.startswith("pytest-of-")))
    return out


def _export(base: Path, only: set[str] | None = None):
    """The class's export under ``base``, and a host socket listening for the attacks to try;
    returns (context, listener, what each student must get)."""
    ctx = hostile_class.Context(grading=base / "grading", marker=f"pwned-{uuid.uuid4().hex[:12]}",
                                secret_env="COURSE_TEST_SECRET", host_socket=base / "host.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(ctx.host_socket))
    listener.listen()
    return ctx, listener, hostile_class.build(base / "export.zip", ctx, only)


def _changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What differs between two fingerprints; for /tmp, the names that came or went."""
    out = sorted(k for k in before.keys() | after.keys() if k != "/tmp" and before.get(k) != after.get(k))
    tmp_before, tmp_after = (set(f.get("/tmp", "").split()) for f in (before, after))
    return out + [f"/tmp/{name}" for name in sorted(tmp_before ^ tmp_after)]


def _processes_with(word: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if word in cmdline and str(os.getpid()) != pid:
            found.append(cmdline)
    return found


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    if sandbox.unavailable():
        skip_or_fail(f"no sandbox on this machine: {sandbox.unavailable()}")
    base = tmp_path_factory.mktemp("hostile")
    ctx, listener, expected = _export(base)
    before = _fingerprint()
    _make("collect", ctx.grading, f"FROM={base / 'export.zip'}")
    stdout = _make("grade", ctx.grading)
    first = _rows(ctx.grading)
    _make("export", ctx.grading)
    exported = _rows(ctx.grading)
    _make("grade", ctx.grading)
    second = _rows(ctx.grading)
    after = _fingerprint()
    listener.close()
    return ctx, expected, first, exported, second, before, after, stdout


def _outputs(ctx, student: str) -> str:
    path = ctx.grading / "autograded" / student / CHAPTER / f"{CHAPTER}.ipynb"
    nb = notebook.read(path)
    return "\n".join(str(o.get("text", "")) + str(o.get("ename", "")) + str(o.get("evalue", ""))
                     + str(o.get("data", {}).get("text/plain", ""))
                     for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_every_student_of_the_export_has_one_row(graded):
    _, expected, first, _, _, _, _, _ = graded
    assert sorted(first) == sorted(expected)
    assert first["王小明_1003"]["name"] == "王小明" and first["王小明_1003"]["lms_id"] == "1003"


def test_every_entry_keeps_its_lms_id_whatever_its_name(graded):
    _, _, first, _, _, _, _, _ = graded
    assert (first["bXssb_11_1037"]["name"], first["bXssb_11_1037"]["lms_id"]) == ("<b>Xss</b> =1+1", "1037")


def test_every_student_gets_exactly_the_expected_points(graded):
    _, expected, first, _, _, _, _, _ = graded
    got = {s: (float(r["autograded"]), r["problem"]) for s, r in first.items()}
    want = {s: (e.points or 0.0, got[s][1] if e.problem and e.problem in got[s][1] else e.problem)
            for s, e in expected.items()}
    assert got == want


def test_each_attack_left_its_trace_in_the_graded_notebook(graded):
    ctx, expected, first, _, _, _, _, _ = graded
    for student, exp in expected.items():
        if exp.output:
            text = _outputs(ctx, student)
            missing = [w for w in exp.output if w not in text]
            assert not missing, (student, missing, text[-2000:])
        assert exp.notes in first[student]["notes"], (student, first[student]["notes"])
        assert exp.flags in first[student]["flags"], (student, first[student]["flags"])


def test_honest_students_are_not_flagged(graded):
    _, expected, first, _, _, _, _, _ = graded
    for student in ["Jane_Doe_1001", "Jane_Doe_1002", "王小明_1003", "Ann_Lee_1004", "Bo_Chen_1005",
                    "Fay_Hi_1035"]:
        assert first[student]["flags"] == "" and first[student]["notes"] == "", first[student]


def test_nothing_outside_the_grading_folder_changed(graded):
    ctx, _, _, _, _, before, after, _ = graded
    assert _changed(before, after) == []
    assert not [p for p in Path("/tmp").glob(f"{ctx.marker}*")]


def test_no_process_outlives_grading(graded):
    ctx, _, _, _, _, _, _, _ = graded
    assert _processes_with(ctx.marker) == []
    assert _processes_with("course_tools.grading.sandboxed.worker") == []


def test_feedback_holds_no_hidden_test_and_no_student_script(graded):
    ctx, _, first, _, _, _, _, _ = graded
    solution = notebook.read(config.solution_path(CHAPTER))
    released = config.student_path(CHAPTER).read_text(encoding="utf-8")
    hidden = set()
    for cell in solution.cells:
        if "### BEGIN HIDDEN TESTS" in cell.source:
            block = cell.source.split("### BEGIN HIDDEN TESTS", 1)[1].split("### END HIDDEN TESTS")[0]
            hidden |= {line.strip() for line in block.splitlines() if len(line.strip()) >= 10}
    # Lines that are also visible tests, or in answers (a reference written out in a hidden test
    # shares lines with the solution, which students' answers may contain), are no secret.
    answers = "\n".join(c.source for c in solution.cells if "### BEGIN HIDDEN TESTS" not in c.source)
    hidden = {line for line in hidden if line not in released and line not in answers}
    assert hidden
    pages = list((ctx.grading / "feedback").rglob("*.html"))
    assert len(pages) == sum(1 for r in first.values() if not r["problem"])
    for page in pages:
        assert page.stat().st_size < 16 * 2**20, page  # a 50 MB error is cut, and says so
        html = page.read_text(encoding="utf-8")
        assert "<script>alert" not in html, page
        text = htmllib.unescape(re.sub(r"<[^>]+>", "", html))  # as a reader sees it
        assert not [line for line in hidden if line in text], page


def test_nothing_but_the_notebook_comes_back_from_the_sandbox(graded):
    ctx, _, _, _, _, _, _, _ = graded
    folder = ctx.grading / "autograded" / "Hal_Ive_1011" / CHAPTER
    names = sorted(p.name for p in folder.iterdir())
    assert names in ([f"{CHAPTER}.ipynb"], [f"{CHAPTER}.ipynb", "timestamp.txt"])


def test_problems_notes_and_flags_survive_export_and_grading_twice_is_identical(graded):
    _, _, first, exported, second, _, _, _ = graded
    assert exported == first
    assert second == first


def test_the_instructor_is_told_which_files_could_not_be_graded(graded):
    _, expected, _, _, _, _, _, stdout = graded
    for student, exp in expected.items():
        if exp.problem:
            assert f"Cannot grade {student}" in stdout


# Graded again by an ordinary user: honest students, the escape, the forged verdict, the fork bomb
# (RLIMIT_NPROC is enforced for an ordinary user) and the daemon. The user is made from root with
# a user namespace: uid 65534 and no capability on the host, but the owner of the checkout and of
# Python (wherever they are installed, /root included), as an instructor is of theirs. bubblewrap
# then runs unprivileged, as it does for an ordinary user.
AS_ORDINARY_USER = ("unshare", "--user", "--map-user=65534", "--map-group=65534")
UNPRIVILEGED_CLASS = {"Jane_Doe_1001", "Jane_Doe_1002", "Gus_Hay_1010", "Ida_Jo_1012",
                      "Jo_Kay_1013", "Xia_Yu_1027"}


@pytest.fixture(scope="module")
def graded_unprivileged():
    if os.geteuid() != 0:
        pytest.skip("this user is not root: the whole hostile class above ran unprivileged")
    if shutil.which("unshare") is None or shutil.which("make") is None:
        pytest.skip("unshare (util-linux) or make is not installed")
    base = Path(tempfile.mkdtemp(prefix="hostile-unprivileged-"))
    try:
        home = {"HOME": str(base)}
        probe = subprocess.run([*AS_ORDINARY_USER, sys.executable, "-c", "import os; from "
                                "course_tools.grading.grader import sandbox; print(os.getuid(), "
                                "sandbox.unavailable() or 'ok')"],
                               cwd=ROOT, capture_output=True, text=True, env={**os.environ, **home})
        if probe.stdout.split() != ["65534", "ok"]:
            skip_or_fail("an ordinary user cannot grade on this machine: "
                         f"{(probe.stdout + probe.stderr).strip()[-300:]}")
        ctx, listener, expected = _export(base, only=UNPRIVILEGED_CLASS)
        before = _fingerprint()
        _make("collect", ctx.grading, f"FROM={base / 'export.zip'}", prefix=AS_ORDINARY_USER, env=home)
        _make("grade", ctx.grading, prefix=AS_ORDINARY_USER, env=home)
        rows = _rows(ctx.grading)
        after = _fingerprint()
        listener.close()
        yield ctx, expected, rows, before, after
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_unprivileged_grading_gives_the_same_points_and_contains_every_attack(graded_unprivileged):
    ctx, expected, rows, before, after = graded_unprivileged
    assert sorted(rows) == sorted(expected)
    assert {s: float(r["autograded"]) for s, r in rows.items()} == {
        s: e.points for s, e in expected.items()}
    for student in ("Jo_Kay_1013", "Xia_Yu_1027"):  # the escape and the forged verdict
        text = _outputs(ctx, student)
        assert not [w for w in expected[student].output if w not in text], (student, text[-2000:])
    # Either the watchdog or RLIMIT_NPROC stops the fork bomb; its author keeps the points.
    bomb = _outputs(ctx, "Gus_Hay_1010")
    assert "processes" in bomb or "Resource temporarily unavailable" in bomb, bomb[-2000:]
    assert _changed(before, after) == []
    assert _processes_with(ctx.marker) == []
    assert _processes_with("course_tools.grading.sandboxed.worker") == []
