"""CI's closing table (.ci/stages.py): stages timed by .ci/run and pytest's folders from its JUnit
report, beside their shares of .ci/budget.toml, the ones over flagged."""

import subprocess
import sys

import tomllib

from tests.conftest import ROOT

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3" time="700">
<testcase classname="tests.lib.test_bpe" name="a" time="100"/>
<testcase classname="tests.grading.test_hostile_class" name="b" time="4000"/>
<testcase classname="tests.test_lint" name="c" time="5"/></testsuite></testsuites>"""


def _table(tmp_path, junit: str | None) -> str:
    (tmp_path / "stages.txt").write_text("apt 50\ninstall 200\nmake test 4500\n")
    if junit is not None:
        (tmp_path / "junit.xml").write_text(junit)
    proc = subprocess.run([sys.executable, str(ROOT / ".ci" / "stages.py"), str(tmp_path / "stages.txt"),
                           str(tmp_path / "junit.xml")], capture_output=True, text=True, check=True)
    return proc.stdout


def test_the_budget_gives_every_stage_a_share_of_40_minutes():
    budget = tomllib.loads((ROOT / ".ci" / "budget.toml").read_text())
    assert budget["total_minutes"] == 40
    assert {"apt", "install", "book", "tests/lib", "tests/notebooks", "tests/grading", "tests/book",
            "tests/*"} <= set(budget["stages"])
    assert sum(budget["stages"].values()) <= 60 * budget["total_minutes"]


def test_the_table_splits_make_test_into_the_book_and_test_folders_and_flags_what_is_over(tmp_path):
    rows = {line.split()[0]: line for line in _table(tmp_path, JUNIT).splitlines() if line.strip()}
    assert rows["book"].split()[1] == "3800"  # make test's 4500 s less pytest's 700 s
    assert rows["tests/lib"].split()[1] == "100" and "OVER" not in rows["tests/lib"]
    assert rows["tests/grading"].split()[1] == "4000" and "OVER BUDGET" in rows["tests/grading"]
    assert "OVER BUDGET" in rows["total"] and "warning: " in _table(tmp_path, JUNIT)


def test_without_a_junit_report_make_test_is_one_row(tmp_path):
    out = _table(tmp_path, None)
    assert "make test (book and tests; no JUnit report)" in out and "tests/lib" not in out
