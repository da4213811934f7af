"""Glued values: what ``glue.text`` writes is what myst-nb pastes into the page, and the book build
hands the book's own pages the times it measured."""

from __future__ import annotations

import re

import nbformat
import pytest
from myst_nb.ext.glue import extract_glue_data_cell
from nbclient import NotebookClient

from course_tools import config
from course_tools.book import build as book
from course_tools.book import glue_records
from course_tools.student import glue
from tests.conftest import CHAPTERS, ROOT


def test_a_glued_value_is_read_back_by_myst_nb_and_shows_nothing_in_jupyter():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from course_tools.student import glue\n"
        "glue.text('val_loss', 1.23456, '.2f')\n"
        "glue.text('steps', 360)")])  # on the last line: no result shown either
    NotebookClient(nb, kernel_name="python3", timeout=60).execute()
    assert glue_records.values(nb) == {"val_loss": "1.23", "steps": "360"}
    visible = [o for o in nb.cells[0].outputs
               if not any(k.startswith(glue.PREFIX) for k in o.get("data", {}))]
    assert visible == []
    pasted = {name: out["data"]["text/plain"] for name, out in extract_glue_data_cell(nb.cells[0])}
    assert pasted == {"val_loss": "1.23", "steps": "360"}  # what {glue:text} puts on the page


def test_glue_names_are_checked_and_plain_python_runs_without_ipython():
    assert glue.text("ratio", 2 / 3, ".3f") is None
    for bad in ("Loss", "1st", "val-loss", ""):
        try:
            glue.text(bad, 1.0)
        except ValueError as e:
            assert "glue name" in str(e)
        else:
            raise AssertionError(f"{bad!r} was accepted")


def test_the_prose_names_are_found_once_each_in_order():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("{glue:text}`b` then {glue:text}`a`"),
        nbformat.v4.new_code_cell("# {glue:text}`code_is_not_prose`"),
        nbformat.v4.new_markdown_cell("{glue:text}`a` again and {glue:text}`c`")])
    assert glue_records.used(nb) == ["b", "a", "c"]


def test_the_book_pages_get_this_builds_chapter_times():
    timings = {"01_tokenization": {"seconds": 7.24}, "03_transformer": {"seconds": 48.6}}
    assert book.substitutions(timings, selfcheck={}) == {
        "chapter_01_seconds": "7", "chapter_03_seconds": "49", "slowest_chapter_seconds": "49",
        "chapters_minutes": "0.9"}


def test_the_set_up_page_gets_the_self_checks_benchmark():
    record = {"machine": "x86_64, 2 cores", "date": "2026-11-28", "chapters": {
        "01_tokenization": {"whole": 9.44, "exercises": {"ex_a": 2.51, "ex_b": 3.06}},
        "03_transformer": {"whole": 24.6, "exercises": {"ex_c": 2.4}}}}
    out = book.substitutions({}, selfcheck=record)
    assert {k: v for k, v in out.items() if k.startswith("selfcheck")} == {
        "selfcheck_01_seconds": "9", "selfcheck_01_exercise_seconds": "3.1", "selfcheck_03_seconds": "25",
        "selfcheck_03_exercise_seconds": "2.4", "selfcheck_exercise_seconds": "3.1",
        "selfcheck_machine": "x86_64, 2 cores", "selfcheck_date": "2026-11-28"}
    substituted = set(re.findall(r"\{\{ (\w+) \}\}", (ROOT / "book" / "setup.md").read_text()))
    assert {k for k in substituted if k.startswith("selfcheck")} <= set(book.substitutions(
        {}, selfcheck={**record, "chapters": {c: record["chapters"]["03_transformer"] for c in CHAPTERS}}))


def _little_course(root):
    """A course of one chapter under ``root``: an install cell, prose quoting x, a cell gluing it;
    course_lib with one module and one data file; the tooling beside it."""
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("# Set-up: installs course_lib"),
        nbformat.v4.new_markdown_cell("x is {glue:text}`x`."),
        nbformat.v4.new_code_cell("glue.text('x', 1)")])
    (root / "solutions" / "01_demo").mkdir(parents=True)
    nbformat.write(nb, str(root / "solutions" / "01_demo" / "01_demo.ipynb"))
    (root / "course_lib").mkdir(parents=True)
    (root / "course_tools").mkdir(parents=True)
    (root / "course_lib" / "model.py").write_text("WIDTH = 1\n")
    (root / "course_lib" / "run.csv").write_text("loss\n1.5\n")
    (root / "course_tools" / "tool.py").write_text("LIMIT = 1\n")


def test_a_chapters_fingerprint_follows_its_code_and_course_lib_not_its_prose(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "root", lambda: tmp_path)
    _little_course(tmp_path)
    path = tmp_path / "solutions" / "01_demo" / "01_demo.ipynb"
    first = glue_records.sources("01_demo")

    def edited(edit) -> bool:
        before = glue_records.sources("01_demo")
        edit()
        return glue_records.sources("01_demo") != before

    def cell(i, text):
        nb = nbformat.read(str(path), as_version=4)
        nb.cells[i].source = text
        nbformat.write(nb, str(path))

    # what measures nothing: the prose, the install cell, the tooling, Python's caches
    assert not edited(lambda: cell(1, "x, measured: {glue:text}`x`."))
    assert not edited(lambda: cell(0, "# Set-up: installs course_lib from another branch"))
    assert not edited(lambda: (tmp_path / "course_tools" / "tool.py").write_text("LIMIT = 2\n"))
    (tmp_path / "course_lib" / "__pycache__").mkdir()
    assert not edited(lambda: (tmp_path / "course_lib" / "__pycache__" / "model.pyc").write_bytes(b"\0"))
    assert glue_records.sources("01_demo") == first
    # what measures: a code cell, a module, a recorded run, a new file
    assert edited(lambda: cell(2, "glue.text('x', 2)"))
    assert edited(lambda: (tmp_path / "course_lib" / "model.py").write_text("WIDTH = 2\n"))
    assert edited(lambda: (tmp_path / "course_lib" / "run.csv").write_text("loss\n1.4\n"))
    assert edited(lambda: (tmp_path / "course_lib" / "new.py").write_text(""))


def test_values_measured_by_older_code_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "root", lambda: tmp_path)
    _little_course(tmp_path)
    record = tmp_path / "book" / "measured" / "01_demo.json"
    glue_records.write(record, {"x": "1"}, glue_records.sources("01_demo"))
    glue_records.check_current(record, "01_demo")  # measured by this code: accepted
    assert glue_records.read(record) == {"x": "1"}
    (tmp_path / "course_lib" / "model.py").write_text("WIDTH = 2\n")  # a change to course_lib
    with pytest.raises(glue_records.StaleRecord,
                       match=r"make book CHAPTER=01_demo.*make release CHAPTER=01_demo"):
        glue_records.check_current(record, "01_demo")
    record.write_text('{"values": {"x": "1"}}\n')  # a record that does not say what measured it
    with pytest.raises(glue_records.StaleRecord):
        glue_records.check_current(record, "01_demo")


def test_every_committed_record_was_measured_by_the_current_code():
    for chapter in CHAPTERS:
        glue_records.check_current(glue_records.record_path(chapter), chapter)  # says how to measure it again
