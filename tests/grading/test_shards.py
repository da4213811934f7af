"""Grading a class in shares, ``grade --shard K/N`` on N machines then ``merge``, writes exactly
what one run writes (the chapter's grades CSV, the combined gradebook, problems, notes and flags,
feedback), and a share graded again
touches no other share."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_tools import config
from course_tools.grading.grader import grade, sandbox
from tests.conftest import CHAPTERS, ROOT
from tests.helpers import answered, mutants, write

CHAPTER = CHAPTERS[0]
# One student per share and a second in share 3, with a problem (shard_of("cat", 3) == 1, ...).
SHARES = {"cat": 1, "dan": 2, "ann": 3, "eve": 3}


def _class(grading: Path) -> None:
    target = f"{CHAPTER}/{CHAPTER}.ipynb"
    write(answered(CHAPTER), grading / "submitted" / "cat" / target)
    write(answered(CHAPTER, mutant=mutants(CHAPTER)[0]), grading / "submitted" / "dan" / target)
    shutil.copytree(config.student_path(CHAPTER).parent, grading / "submitted" / "ann" / CHAPTER)
    write(nbformat.v4.new_notebook(), grading / "submitted" / "eve" / target)  # empty: a problem


def _cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    """A separate process, as each machine of a cluster runs it."""
    scripts = str(Path(sys.executable).parent)  # nbgrader runs `alembic` by name
    env = dict(os.environ, PATH=os.pathsep.join([scripts, os.environ.get("PATH", "")]))
    extra = ["--unsandboxed"] if args[0] == "grade" and sandbox.unavailable() else []
    proc = subprocess.run([sys.executable, "-m", "course_tools", *args, *extra], cwd=ROOT,
                          capture_output=True, text=True, env=env)
    assert (proc.returncode == 0) == ok, proc.stdout + proc.stderr
    return proc


def _fingerprint(folder: Path) -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("shards")
    one, shared = base / "one" / "grading", base / "shared" / "grading"
    for g in (one, shared):
        _class(g)
    _cli("grade", CHAPTER, "--grading-dir", str(one))
    for k in (1, 2, 3):
        _cli("grade", CHAPTER, "--grading-dir", str(shared), "--shard", f"{k}/3")
    _cli("merge", CHAPTER, "--grading-dir", str(shared))
    return one, shared


def test_the_shares_are_stable_and_split_the_class():
    assert {s: grade.shard_of(s, 3) for s in SHARES} == SHARES
    assert grade.parse_shard("2/8") == (2, 8)
    for bad in ("0/3", "4/3", "2", "a/b"):
        with pytest.raises(SystemExit, match="--shard"):
            grade.parse_shard(bad)


def test_merged_shares_write_exactly_what_one_run_writes(graded):
    one, shared = graded
    for k in (1, 2, 3):
        part = json.loads((grade.shard_dir(CHAPTER, shared, k, 3) / "graded" / f"{CHAPTER}.json").read_text())
        assert sorted(part) == sorted(s for s, share in SHARES.items() if share == k)
    for table in (f"grades/{CHAPTER}.csv", "gradebook.csv", f"grades/{CHAPTER}-summary.txt"):
        assert (shared / table).read_text() == (one / table).read_text()
    record = json.loads((one / "graded" / f"{CHAPTER}.json").read_text())
    assert json.loads((shared / "graded" / f"{CHAPTER}.json").read_text()) == record
    assert record["eve"]["problem"] == "the notebook is empty" and not record["cat"]["problem"]
    feedback = {p.relative_to(one): p.read_text() for p in (one / "feedback").rglob("*.html")}
    assert len(feedback) == 3  # every student but the one with a problem
    assert {p.relative_to(shared): p.read_text() for p in (shared / "feedback").rglob("*.html")} == feedback


def test_a_share_graded_again_touches_no_other_and_merge_waits_for_every_share(graded):
    one, shared = graded
    others = {k: _fingerprint(grade.shard_dir(CHAPTER, shared, k, 3)) for k in (1, 3)}
    _cli("grade", CHAPTER, "--grading-dir", str(shared), "--shard", "2/3")
    assert {k: _fingerprint(grade.shard_dir(CHAPTER, shared, k, 3)) for k in (1, 3)} == others
    _cli("merge", CHAPTER, "--grading-dir", str(shared))
    table = Path("grades") / f"{CHAPTER}.csv"
    assert (shared / table).read_text() == (one / table).read_text()
    (grade.shard_dir(CHAPTER, shared, 3, 3) / "graded" / f"{CHAPTER}.json").unlink()  # share 3 stopped
    proc = _cli("merge", CHAPTER, "--grading-dir", str(shared), ok=False)
    assert "Shares 3/3 of" in proc.stderr and f"grade {CHAPTER} --shard K/3" in proc.stderr
