"""Collecting an LMS export: students matched by file name, problems reported."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from course_lib.grading import collect, config
from tests.conftest import CHAPTERS, ROOT

CHAPTER = CHAPTERS[0]


@pytest.mark.parametrize("name, student", [
    ("HW1_jdoe_attempt_2026-11-20-10-00-00_01_tokenization.ipynb", "jdoe"),
    ("Jane Doe_1234_assignsubmission_file_my work.ipynb", "Jane_Doe"),
    ("doejane_12345_67890_01_tokenization.ipynb", "doejane"),
    ("doejane_late_12345_67890_01_tokenization-1.ipynb", "doejane"),
    ("alice/01_tokenization.ipynb", "alice"),
])
def test_student_is_found_in_each_lms_naming_scheme(name, student):
    assert collect.student_of(name)[0] == student


def test_unknown_names_match_nothing_without_a_folder():
    assert collect.student_of("final.ipynb") is None
    assert collect.student_of("final.ipynb", pattern=r"(?P<student>x)") is None
    assert collect.student_of("bob-final.ipynb", pattern=r"(?P<student>[a-z]+)-")[0] == "bob"


def test_collect_a_zip_files_notebooks_and_reports_the_rest(tmp_path):
    nb = config.student_path(CHAPTER).read_bytes()
    export = tmp_path / "export.zip"
    with zipfile.ZipFile(export, "w") as z:
        z.writestr("HW1_jdoe_attempt_2026-11-20-10-00-00_nb.ipynb", b'{"old": 1}')
        z.writestr("HW1_jdoe_attempt_2026-11-21-09-00-00_nb.ipynb", nb)  # later: wins
        z.writestr("HW1_asmith_attempt_2026-11-20-11-00-00_nb.ipynb", nb)
        z.writestr("HW1_asmith_attempt_2026-11-20-11-00-00_notes.txt", b"hello")
        z.writestr("orphan.ipynb", nb)
    grading = tmp_path / "grading"
    proc = subprocess.run([sys.executable, "-m", "course_lib.grading", "collect", CHAPTER, str(export),
                           "--grading-dir", str(grading)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "Collected 2 students." in proc.stdout
    assert "could not match a student to: orphan.ipynb" in proc.stdout
    assert "not a notebook, skipped: HW1_asmith_attempt_2026-11-20-11-00-00_notes.txt" in proc.stdout
    assert "superseded by a later file: HW1_jdoe_attempt_2026-11-20-10-00-00_nb.ipynb" in proc.stdout
    for student in ("jdoe", "asmith"):
        assert (grading / "submitted" / student / CHAPTER / f"{CHAPTER}.ipynb").read_bytes() == nb


def test_collect_a_folder_per_student_and_bad_sources(tmp_path):
    (tmp_path / "in" / "carol").mkdir(parents=True)
    (tmp_path / "in" / "carol" / "whatever.ipynb").write_text("{}")
    report = collect.collect(CHAPTER, tmp_path / "in", tmp_path / "grading")
    assert report.collected == {"carol": "carol/whatever.ipynb"}
    with pytest.raises(SystemExit, match="No such file"):
        collect.collect(CHAPTER, tmp_path / "missing.zip", tmp_path / "grading")
    (tmp_path / "not.zip").write_text("plain text")
    with pytest.raises(SystemExit, match="neither a folder nor a zip"):
        collect.collect(CHAPTER, tmp_path / "not.zip", tmp_path / "grading")
    with pytest.raises(SystemExit, match="Unknown chapter"):
        collect.collect("99_nothing", tmp_path / "in", tmp_path / "grading")
