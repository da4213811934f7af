"""Glued values: what ``glue.text`` writes is what myst-nb pastes into the page, and the book build
hands the book's own pages the times it measured."""

from __future__ import annotations

import re

import nbformat
from myst_nb.ext.glue import extract_glue_data_cell
from nbclient import NotebookClient

from course_lib.grading import book, glue
from tests.conftest import CHAPTERS, ROOT


def test_a_glued_value_is_read_back_by_myst_nb_and_shows_nothing_in_jupyter():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from course_lib.grading import glue\n"
        "glue.text('val_loss', 1.23456, '.2f')\n"
        "glue.text('steps', 360)")])  # on the last line: no result shown either
    NotebookClient(nb, kernel_name="python3", timeout=60).execute()
    assert glue.values(nb) == {"val_loss": "1.23", "steps": "360"}
    visible = [o for o in nb.cells[0].outputs if not any(k.startswith(glue.PREFIX) for k in o.get("data", {}))]
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
    assert glue.used(nb) == ["b", "a", "c"]


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
