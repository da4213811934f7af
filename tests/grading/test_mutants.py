"""Every chapter's graders kill at least 90% of its catalogue of plausible wrong answers."""

import pytest

from course_lib.grading import config, mutants, notebook
from tests.conftest import CHAPTERS


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_catalogue_covers_every_exercise(chapter):
    import yaml

    catalogue = yaml.safe_load(mutants.catalogue_path(chapter).read_text())
    names = {ex.name for ex in notebook.exercises(notebook.read(config.solution_path(chapter)))}
    assert {m["grade_id"] for m in catalogue} == names
    for name in names:
        n = sum(m["grade_id"] == name for m in catalogue)
        assert n >= mutants.MIN_PER_EXERCISE, f"{name} has {n} mutants"
    for m in catalogue:
        assert set(m) == {"grade_id", "find", "replace", "why"}, m
        assert m["find"] != m["replace"]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_kill_rate_at_least_90_percent(chapter):
    verdicts = mutants.grade(chapter)
    survivors = [f"{v.grade_id}: {v.why}" for v in verdicts if not v.killed]
    rate = 1 - len(survivors) / len(verdicts)
    assert rate >= mutants.KILL_RATE_TARGET, f"kill rate {rate:.0%}; survivors: {survivors}"
