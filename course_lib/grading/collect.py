"""Collect: file the notebooks a learning-management system exports, ready for grading.

    python -m course_lib.grading collect 01_tokenization submissions.zip
    python -m course_lib.grading collect 01_tokenization folder/ --pattern '(?P<student>[^_]+)_.*'

The source is a zip file or a folder. Each ``.ipynb`` in it is matched to a student by its file
name, as nbgrader's ``zip_collect`` does, with the first of these patterns that fits (or your
own ``--pattern`` with a ``student`` group, and optionally a ``timestamp`` group):

============  =====================================================  =======================
LMS           file name                                              student
============  =====================================================  =======================
Blackboard    ``HW1_jdoe_attempt_2026-11-20-10-00-00_nb.ipynb``       ``jdoe``
Moodle        ``Jane Doe_1234_assignsubmission_file_nb.ipynb``        ``Jane_Doe``
Canvas        ``doejane_12345_67890_nb.ipynb`` (``late_`` allowed)    ``doejane``
a folder      ``jdoe/anything.ipynb``                                 ``jdoe``
============  =====================================================  =======================

Each student's notebook is copied to ``<grading>/submitted/<student>/<chapter>/<chapter>.ipynb``.
When a student has several, the latest timestamp (else the last name in sort order) wins.
Files that match no pattern, and non-notebooks, are reported, never silently dropped.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from . import config

PATTERNS = {
    "blackboard": r"^.+?_(?P<student>[^_]+)_attempt_(?P<timestamp>[0-9-]+)_.+$",
    "moodle": r"^(?P<student>.+?)_\d+_assignsubmission_file_.+$",
    "canvas": r"^(?P<student>[a-z0-9]+)_(?:late_)?\d+_\d+_.+$",
}


@dataclass
class Report:
    collected: dict[str, str] = field(default_factory=dict)  # student -> source file
    unmatched: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # not notebooks
    superseded: list[str] = field(default_factory=list)  # older duplicates

    def lines(self) -> list[str]:
        out = [f"Collected {len(self.collected)} students."]
        out += [f"  could not match a student to: {f}" for f in self.unmatched]
        out += [f"  not a notebook, skipped: {f}" for f in self.skipped]
        out += [f"  superseded by a later file: {f}" for f in self.superseded]
        return out


def student_of(relpath: str, pattern: str | None = None) -> tuple[str, str] | None:
    """(student, sort key) for a file's path inside the export, or None if nothing matches."""
    name = Path(relpath).name
    patterns = [pattern] if pattern else list(PATTERNS.values())
    for p in patterns:
        m = re.match(p, name)
        if m:
            return _clean(m.group("student")), (m.groupdict().get("timestamp") or "") + name
    parts = Path(relpath).parts
    if pattern is None and len(parts) >= 2:  # one folder per student
        return _clean(parts[-2]), name
    return None


def _clean(student: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", student.strip()).strip("_.") or "unknown"


def collect(chapter: str, source: Path, grading_dir: Path | None = None,
            pattern: str | None = None) -> Report:
    if chapter not in config.chapters():
        raise SystemExit(f"Unknown chapter {chapter!r}; expected one of {config.chapters()}.")
    source = Path(source)
    if not source.exists():
        raise SystemExit(f"No such file or folder: {source}")
    grading_dir = Path(grading_dir or config.root() / "grading")
    report = Report()
    with tempfile.TemporaryDirectory() as tmp:
        if source.is_file():
            if not zipfile.is_zipfile(source):
                raise SystemExit(f"{source} is neither a folder nor a zip file.")
            with zipfile.ZipFile(source) as z:
                z.extractall(tmp)
            source = Path(tmp)
        best: dict[str, tuple[str, Path]] = {}
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            rel = path.relative_to(source).as_posix()
            if "__MACOSX" in rel or path.name.startswith("."):
                continue
            if path.suffix != ".ipynb":
                report.skipped.append(rel)
                continue
            match = student_of(rel, pattern)
            if match is None:
                report.unmatched.append(rel)
                continue
            student, key = match
            if student in best:
                older = min(best[student], (key, path))
                report.superseded.append(older[1].relative_to(source).as_posix())
                best[student] = max(best[student], (key, path))
            else:
                best[student] = (key, path)
        for student, (_, path) in sorted(best.items()):
            target = grading_dir / "submitted" / student / chapter / f"{chapter}.ipynb"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            report.collected[student] = path.relative_to(source).as_posix()
    return report
