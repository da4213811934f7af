"""grades.csv: text that students control (names, problems) never runs in a spreadsheet."""

from __future__ import annotations

import csv
import zipfile

import pytest

from course_lib.grading import collect, grade
from tests.conftest import CHAPTERS

CHAPTER = CHAPTERS[0]


@pytest.mark.parametrize("text, safe", [
    ("=2+5", "'=2+5"), ("@SUM(1+9)", "'@SUM(1+9)"), ("-1+2", "'-1+2"), ("+1", "'+1"),
    ("\tx", "'\tx"), ("\r=1", "'\r=1"), ("Jane Doe", "Jane Doe"), ("a=1", "a=1"), ("", ""),
    (-1.5, -1.5), (0.0, 0.0), (None, None),
])
def test_formula_like_text_is_neutralised_and_numbers_stay_numbers(text, safe):
    assert grade.spreadsheet_safe(text) == safe


def test_every_text_cell_of_grades_csv_is_safe(tmp_path):
    names = {"1001": "=2+5", "1002": "@SUM(1+9)", "1003": "-1+2", "1004": "+49 Ann"}
    export = tmp_path / "export.zip"
    with zipfile.ZipFile(export, "w") as z:
        for lms_id, name in names.items():
            z.writestr(f"{name}_{lms_id}_assignsubmission_file_nb.ipynb", b"{}")
    grading = tmp_path / "grading"
    students = sorted(collect.collect(CHAPTER, export, grading).students)
    record = {s: {"problem": "\tx", "notes": ["+1 repaired"], "flags": ["@A1;=1+2"]} for s in students}
    path = grade.write_grades_csv(CHAPTER, students, grading, record)
    with path.open(encoding="utf-8", newline="") as f:
        rows = {row["lms_id"]: row for row in csv.DictReader(f)}
    assert {k: row["name"] for k, row in rows.items()} == {k: "'" + name for k, name in names.items()}
    assert rows["1003"]["student"] == "'-12_1003"  # a folder name may start with "-" too
    for row in rows.values():
        assert not [v for v in row.values() if v.startswith(grade.FORMULA_START)], row
        assert (row["problem"], row["notes"], row["flags"]) == ("'\tx", "'+1 repaired", "'@A1;=1+2")
    line = next(t for t in path.read_text(encoding="utf-8").splitlines() if "1003" in t)
    assert line.startswith('"\'-12_1003","\'-1+2","1003",') and ",0.0,0.0," in line  # numbers unquoted
