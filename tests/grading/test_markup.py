"""Released notebooks carry plain Markdown: MyST roles and directives, which JupyterLab and Colab
show as raw text, are rewritten by course_tools.book.markup (the book keeps its MyST)."""

from __future__ import annotations

import re

import pytest

from course_tools import config, notebook
from course_tools.book import markup
from tests.conftest import CHAPTERS

MYST = re.compile(r"\{(cite:p|cite:t|term|numref|doc|ref|eq|glue:text)\}`|^[`:]{3,}\{", re.M)


def test_citations_are_author_year_from_the_bibliography():
    assert markup.plain("{cite:p}`Vaswani2017`") == "(Vaswani et al., 2017)"
    assert markup.plain("{cite:p}`Nadaraya1964,Watson1964`") == "(Nadaraya, 1964; Watson, 1964)"
    assert markup.plain("as {cite:t}`Vaswani2017` showed") == "as Vaswani et al. (2017) showed"
    refs = markup.bibliography()
    assert refs["Vaswani2017"] == ("Vaswani et al.", "2017") and len(refs) > 50
    with pytest.raises(ValueError, match="NoSuchPaper2099"):
        markup.plain("{cite:p}`NoSuchPaper2099`")


def test_authors_two_names_and_braces():
    assert markup._authors("Kaplan, Jared and McCandlish, Sam") == "Kaplan and McCandlish"
    assert markup._authors("{\\L}ukasz Kaiser") == "Kaiser"
    assert markup._authors("Gage, Philip") == "Gage"


def test_terms_figures_admonitions_and_dropdowns():
    assert markup.plain("a {term}`merge` and {term}`tokens <token>`") == "a *merge* and *tokens*"
    figures = {"fig-loss": "Validation loss against steps"}
    assert markup.plain("see {numref}`fig-loss`.", figures) == (
        'see the figure "Validation loss against steps".')
    with pytest.raises(ValueError, match="fig-missing"):
        markup.plain("{numref}`fig-missing`", figures)
    source = "Intro\n\n```{admonition} Learning goals\n:class: tip\n- one\n- two\n```\n\nAfter"
    assert markup.plain(source) == "Intro\n\n> **Learning goals**\n>\n> - one\n> - two\n\nAfter"
    source = "::::{dropdown} Answers\n1. {term}`merge`\n::::"
    assert markup.plain(source) == "<details><summary>Answers</summary>\n\n1. *merge*\n\n</details>"
    assert markup.plain("no markup, `code` and $x^2$") == "no markup, `code` and $x^2$"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_released_notebooks_have_no_myst_left(chapter):
    student = notebook.read(config.student_path(chapter))
    solution = notebook.read(config.solution_path(chapter))
    left = [c.source[:80] for c in student.cells if c.cell_type == "markdown" and MYST.search(c.source)]
    assert not left, f"MyST markup left in the released notebook: {left}"
    # the solution, which the book renders, keeps its MyST
    assert any(MYST.search(c.source) for c in solution.cells if c.cell_type == "markdown")


def test_glued_numbers_become_the_recorded_values_and_a_missing_one_is_an_error():
    values = {"gpt_loss": "1.62", "train_seconds": "41"}
    assert markup.plain("ends at {glue:text}`gpt_loss` nats after {glue:text}`train_seconds` s", None,
                        values) == "ends at 1.62 nats after 41 s"
    with pytest.raises(ValueError, match="book --only"):
        markup.plain("{glue:text}`not_measured`", None, values)
    with pytest.raises(ValueError, match="glue.text"):
        markup.plain("{glue:text}`gpt_loss:.1f`", None, values)
