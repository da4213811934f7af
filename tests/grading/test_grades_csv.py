"""grades.csv: text that students control (names, problems) never runs in a spreadsheet, and a
problem says why in words, with nothing of the host."""

from __future__ import annotations

import csv
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from course_tools import config
from course_tools.grading.grader import collect, failures, grade, gradebook, nbgrader_cli, safe_text
from tests.conftest import CHAPTERS, ROOT

CHAPTER = CHAPTERS[0]


@pytest.mark.parametrize("text, safe", [
    ("=2+5", "'=2+5"), ("@SUM(1+9)", "'@SUM(1+9)"), ("-1+2", "'-1+2"), ("+1", "'+1"),
    ("\tx", "'\tx"), ("\r=1", "'\r=1"), ("  =1", "'  =1"), ("Jane Doe", "Jane Doe"), ("a=1", "a=1"), ("", ""),
    (-1.5, -1.5), (0.0, 0.0), (None, None),
])
def test_formula_like_text_is_neutralised_and_numbers_stay_numbers(text, safe):
    assert safe_text.spreadsheet_safe(text) == safe


def test_every_text_cell_of_grades_csv_is_safe(tmp_path, monkeypatch):
    # nbgrader's gradebook calls the `alembic` script by name: this interpreter's scripts on PATH
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent),
                                                os.environ.get("PATH", "")]))
    names = {"1001": "=2+5", "1002": "@SUM(1+9)", "1003": "-1+2", "1004": "+49 Ann"}
    export = tmp_path / "export.zip"
    with zipfile.ZipFile(export, "w") as z:
        for lms_id, name in names.items():
            z.writestr(f"{name}_{lms_id}_assignsubmission_file_nb.ipynb", b"{}")
    grading = tmp_path / "grading"
    students = sorted(collect.collect(CHAPTER, export, grading).students)
    record = {s: {"problem": "\tx", "notes": ["+1 repaired"], "flags": ["@A1;=1+2"]} for s in students}
    path = gradebook.write_grades_csv(CHAPTER, students, grading, record)
    with path.open(encoding="utf-8", newline="") as f:
        rows = {row["lms_id"]: row for row in csv.DictReader(f)}
    assert {k: row["name"] for k, row in rows.items()} == {k: "'" + name for k, name in names.items()}
    assert rows["1003"]["student"] == "'-12_1003"  # a folder name may start with "-" too
    for row in rows.values():
        assert not [v for v in row.values() if v.lstrip().startswith(safe_text.FORMULA_START)], row
        # the tab is a space (one readable line), and a space before no formula needs no quote
        assert (row["problem"], row["notes"], row["flags"]) == (" x", "'+1 repaired", "'@A1;=1+2")
    line = next(t for t in path.read_text(encoding="utf-8").splitlines() if "1003" in t)
    assert line.startswith('"\'-12_1003","\'-1+2","1003",') and ",0.0,0.0," in line  # numbers unquoted


def test_each_chapter_keeps_its_table_and_the_gradebook_joins_them(tmp_path, monkeypatch):
    """Grading a second chapter leaves the first's table; gradebook.csv has a row per student and a
    column per chapter and exercise, numbers unquoted, empty where a student has no row."""
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent),
                                                os.environ.get("PATH", "")]))
    first, second = CHAPTERS[0], CHAPTERS[1]
    grading = tmp_path / "grading"
    grading.mkdir()
    for chapter, students in ((first, ["amy", "bob"]), (second, ["bob"])):
        record = {s: {"problem": "the notebook is empty", "notes": [], "flags": []} for s in students}
        assert gradebook.write_grades_csv(chapter, students, grading, record) == (
            grading / "grades" / f"{chapter}.csv")
    assert sorted(p.name for p in (grading / "grades").iterdir()) == [f"{first}.csv", f"{second}.csv"]
    # Two small tables by hand (one exercise, one written question each), then joined.
    (grading / "grades" / f"{first}.csv").write_text(
        '"student","name","lms_id","chapter","ex_a","q_why","autograded","autograded_max","total","max",'
        '"problem","notes","flags"\n'
        f'"amy","Amy","11","{first}",2.0,"",2.0,3.0,2.0,5.0,"","",""\n'
        f'"\'=bob","\'=Bob","12","{first}",0.0,1.0,0.0,3.0,1.0,5.0,"","",""\n', encoding="utf-8")
    (grading / "grades" / f"{second}.csv").write_text(
        '"student","name","lms_id","chapter","ex_b","autograded","autograded_max","total","max",'
        '"problem","notes","flags"\n'
        f'"\'=bob","\'=Bob","12","{second}",4.0,4.0,4.0,4.0,4.0,"","",""\n', encoding="utf-8")
    path = gradebook.write_combined(grading)
    assert path == grading / "gradebook.csv"
    columns = [f"{c}:{n}" for c, names in ((first, ["ex_a", "q_why"]), (second, ["ex_b"]))
               for n in [*names, "autograded", "autograded_max", "total", "max"]]
    header = ",".join(f'"{c}"' for c in ["student", "name", "lms_id", *columns])
    assert path.read_text(encoding="utf-8").splitlines() == [
        header,
        '"\'=bob","\'=Bob","12",0.0,1.0,0.0,3.0,1.0,5.0,4.0,4.0,4.0,4.0,4.0',
        '"amy","Amy","11",2.0,"",2.0,3.0,2.0,5.0,"","","","",""',
    ]


def test_a_grader_failure_names_its_cause_in_words_without_host_paths(tmp_path):
    grading = tmp_path / "My Course" / "grading"  # a host path with a space
    where = f"{grading}/submitted/jdoe/{CHAPTER}"
    log = (f"nbgrader autograde {CHAPTER} failed:\n"
           f"[AutogradeApp | ERROR] There was an error processing assignment: {where}\n"
           "[AutogradeApp | ERROR] Traceback (most recent call last):\n"
           f'      File "{sys.prefix}/lib/python3.11/site-packages/nbgrader/x.py", line 3, in f\n'
           f"    KeyError: '{where}/{CHAPTER}.ipynb'\n\n"
           "    During handling of the above exception, another exception occurred:\n\n"
           "    Traceback (most recent call last):\n"
           f'      File "{ROOT}/course_lib/x.py", line 1, in g\n'
           f"    nbgrader.converters.base.NbGraderException: cannot read {where}/x.ipynb, nor "
           f"{Path.home()}/.jupyter or /etc/jupyter/nbgrader_config.py; {'the notebook is broken ' * 20}\n"
           "[AutogradeApp | ERROR] Please see the the above traceback for details.\n")
    cause = failures.failure_cause(log, grading)
    start = "NbGraderException: cannot read <path>, nor <path> or <path>; the notebook is broken "
    assert cause.startswith(start) and cause.endswith(" broken …") and len(cause) <= 200, cause
    assert not re.search(r"/\w", cause)  # no path left, not even a piece of one
    short = failures.failure_cause(log.replace("the notebook is broken " * 20, "that is all"), grading)
    assert short.endswith("; that is all (while handling KeyError: '<path>')"), short


def test_problems_of_collect_and_of_a_real_grader_failure_reach_grades_csv_in_words(tmp_path):
    """Two notebooks of one student at one time, and a timestamp.txt nbgrader cannot read (it
    fails before any of the notebook runs)."""
    grading = tmp_path / "grading"
    export = tmp_path / "e.zip"
    with zipfile.ZipFile(export, "w") as z:
        for answer in ("right", "wrong"):
            z.writestr(f"HW1_jdoe_attempt_2026-11-20-10-00-00_{answer}.ipynb", answer)
    collect.collect(CHAPTER, export, grading)
    folder = grading / "submitted" / "ts" / CHAPTER
    folder.mkdir(parents=True)
    shutil.copy(config.student_path(CHAPTER), folder)
    (folder / "timestamp.txt").write_text("yesterday at /etc/passwd o'clock")
    path = grade.grade(CHAPTER, grading, unsandboxed=True)
    with path.open(encoding="utf-8") as f:
        problems = {row["student"]: row["problem"] for row in csv.DictReader(f)}
    assert problems["jdoe"].startswith("2 notebooks submitted at the same time")
    problem = problems["ts"]
    assert problem.startswith("autograding failed: ") and "yesterday at <path> o'clock" in problem, problem
    assert "/etc" not in problem and str(tmp_path) not in problem and len(problem) < 250


def test_an_autograding_process_that_dies_fails_its_student_alone_and_is_started_again():
    """The process that grades student after student (nbgrader_cli.each_student), here a stand-in
    that answers as it does and dies at one student: that student's failure says how, with what
    the process printed, and the next student is graded by a new process."""
    script = ("import json, os, sys\n"
              "for line in sys.stdin:\n"
              "    student = json.loads(line)\n"
              "    if student == 'crash':\n"
              "        print('it broke here', file=sys.stderr, flush=True)\n"
              "        os._exit(3)\n"
              "    print(json.dumps({'student': student, 'failure': None}), flush=True)\n")
    with nbgrader_cli._Student([sys.executable, "-c", script], f"nbgrader autograde {CHAPTER}") as grader:
        assert grader.run("ann") is None
        first = grader.proc.pid
        why = grader.run("crash")
        assert why.startswith(f"nbgrader autograde {CHAPTER} stopped (exit status 3)") and \
            "it broke here" in why
        assert grader.run("bob") is None and grader.proc.pid != first
        assert grader.run("a folder\nname") is None  # one line per student, whatever the name
