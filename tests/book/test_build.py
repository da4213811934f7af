"""The build executed every solution within its budget and kept the lecture examples."""

import json

from course_lib.grading import config
from tests.conftest import CHAPTERS, ROOT


def test_every_solution_ran_within_twice_its_budget():
    timings = json.loads((ROOT / "_build" / "timings.json").read_text())
    assert set(timings) == set(CHAPTERS)
    for chapter, seconds in timings.items():
        assert seconds <= 2 * config.NOTEBOOK_BUDGET_S, f"{chapter} took {seconds} s"


def test_intro_shows_next_token_examples_as_input_target_pairs(html_dir):
    intro = (html_dir / "book" / "intro.html").read_text(encoding="utf-8")
    for text in ("Mary had a little", "E = M", "bagel with cream cheese"):
        assert text in intro


def test_colab_button_opens_the_student_notebook_on_the_configured_branch(html_dir):
    url, branch = config.repository()
    org_repo = url.removeprefix("https://github.com/")
    for chapter in CHAPTERS:
        page = (html_dir / "notebooks" / chapter / f"{chapter}.html").read_text(encoding="utf-8")
        expected = (f"https://colab.research.google.com/github/{org_repo}/blob/{branch}/"
                    f"notebooks/{chapter}/{chapter}.ipynb")
        assert expected in page
