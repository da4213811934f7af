"""Whatever one submission holds is that student's problem alone: the class is always graded, the
record and the tables are written whole, and a student's text reaches them readable and inert."""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import pytest
from nbformat.v4 import new_markdown_cell

from course_tools import config, notebook
from course_tools.grading.grader import grade, gradebook, nbgrader_cli, safe_text
from tests.conftest import CHAPTERS
from tests.helpers import answered

CHAPTER = CHAPTERS[0]


def _rows(path: Path) -> dict[str, dict]:
    with path.open(encoding="utf-8", newline="") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


@pytest.fixture
def nbgrader_on_path(monkeypatch):
    # nbgrader's gradebook calls the `alembic` script by name: this interpreter's scripts on PATH
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent),
                                                os.environ.get("PATH", "")]))


def test_lone_surrogates_in_a_written_cell_and_a_metadata_key_are_graded(tmp_path, monkeypatch,
                                                                         nbgrader_on_path):
    """``"\\ud800"`` is valid JSON and no UTF-8: in a markdown cell it stopped the class while
    staging; in an nbgrader metadata key, the record was left empty after autograding."""
    nb = answered(CHAPTER)
    nb.cells.append(new_markdown_cell("my notes \ud800 end"))
    test_cell = next(c for c in nb.cells if notebook.nbgrader_meta(c).get("grade")
                     and not notebook.nbgrader_meta(c).get("solution"))
    test_cell.metadata["nbgrader"]["odd\ud800"] = 1
    test_id = test_cell.metadata["nbgrader"]["grade_id"]
    grading = tmp_path / "grading"
    path = grading / "submitted" / "sam" / CHAPTER / f"{CHAPTER}.ipynb"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(nb, ensure_ascii=True), encoding="ascii")  # as a browser may save it

    csv_path = grade.grade(CHAPTER, grading, unsandboxed=True)
    assert csv_path == grading / "grades" / f"{CHAPTER}.csv"
    full = sum(ex.points for ex in notebook.exercises(notebook.read(config.solution_path(CHAPTER))))
    row = _rows(csv_path)["sam"]
    assert (row["problem"], float(row["autograded"])) == ("", full)
    note = f"the test cell {test_id} had odd\ufffd 1 instead of None; restored from the release"
    assert row["notes"] == note
    record = json.loads((grading / "graded" / f"{CHAPTER}.json").read_text(encoding="utf-8"))
    assert note in record["sam"]["notes"]

    # A feedback page that cannot be written is said in the row; the points stand.
    def failing(step, chapter, students, *args, **kw):
        return {s: "[GenerateFeedbackApp | ERROR] RuntimeError: page too odd" for s in students}

    monkeypatch.setattr(nbgrader_cli, "each_student", failing)
    row = _rows(grade.export(CHAPTER, grading))["sam"]
    assert (row["problem"], float(row["autograded"])) == \
        ("no feedback page: RuntimeError: page too odd", full)
    combined = _rows(grading / gradebook.COMBINED)["sam"]
    assert float(combined[f"{CHAPTER}:autograded"]) == full


@pytest.mark.parametrize("content, note", [
    (None, "the report of the graded runs is missing: their flags and notes are not shown"),
    (b'{"flags": ["cut', "the report of the graded runs is unreadable (JSONDecodeError): "
                         "their flags and notes are not shown"),
    (b'["a list"]', "the report of the graded runs is unreadable (ValueError): "
                    "their flags and notes are not shown"),
    (b'{"flags": "not a list"}', "the report of the graded runs is unreadable (ValueError): "
                                 "their flags and notes are not shown"),
    (b"\xff\xfe{", "the report of the graded runs is unreadable (JSONDecodeError): "
                   "their flags and notes are not shown"),
])
def test_a_missing_or_broken_report_is_a_note_never_an_exception(tmp_path, content, note):
    report = tmp_path / "sam.json"
    if content is not None:
        report.write_bytes(content)
    rec = {"problem": None, "notes": [], "flags": []}
    grade._read_report(report, rec)
    assert rec == {"problem": None, "notes": [note], "flags": []}


def test_a_reports_text_arrives_as_one_readable_line(tmp_path):
    report = tmp_path / "sam.json"
    report.write_text(json.dumps({"flags": ["calls \x1b[31mevil\x1b[0m\n=HYPERLINK(\"x\") \ud800"],
                                  "notes": ["a\u202eb"]}), encoding="ascii")
    rec = {"problem": None, "notes": [], "flags": []}
    grade._read_report(report, rec)
    assert rec == {"problem": None, "notes": ["a b"], "flags": ['calls evil =HYPERLINK("x") \ufffd'],
                   "mistakes": {}}


def test_a_reports_mistakes_arrive_as_text_or_none(tmp_path):
    report = tmp_path / "sam.json"
    report.write_text(json.dumps({"mistakes": {"ex_a": "softmax over the queries\n=1", "ex_b": None,
                                               "ex_c": "", "ex_d": 5}}))
    rec = {"problem": None, "notes": [], "flags": []}
    grade._read_report(report, rec)
    assert rec["mistakes"] == {"ex_a": "softmax over the queries =1", "ex_b": None, "ex_c": "", "ex_d": "5"}
    report.write_text(json.dumps({"mistakes": ["not", "a dict"]}))
    grade._read_report(report, rec)
    assert rec["mistakes"] == {}


def test_records_are_written_whole_and_read_back_whatever_they_hold(tmp_path):
    path = tmp_path / "graded" / "01.json"
    record = {"sam": {"problem": None, "notes": ["odd\ud800 key", "王小明"], "flags": []}}
    safe_text.write_json(path, record)
    assert json.loads(path.read_text(encoding="utf-8")) == record
    assert "王小明" in path.read_text(encoding="utf-8")  # readable, not escaped
    assert [p.name for p in path.parent.iterdir()] == ["01.json"]  # no temporary file left
    path.write_text("")  # what a grading that stopped half-way used to leave
    assert grade._load_record(path) is None


def test_a_text_cell_is_one_readable_line_no_spreadsheet_runs():
    assert safe_text.cell("\x1b[1m=HYPERLINK(\"http://x\")\x1b[0m") == "'=HYPERLINK(\"http://x\")"
    assert safe_text.cell("ok; \x07<b>x</b>\r\n-1") == "ok;  <b>x</b>  -1"
    assert safe_text.cell("\n=1") == "' =1"
    assert safe_text.cell("a\ud800") == "a\ufffd"
    assert safe_text.cell(1.5) == 1.5 and safe_text.cell(None) is None
