"""Grading runs what the grade needs: a chapter-03 submission gets the same points with and
without the chapter's unchanged demonstrations (training runs, figures), in a fraction of the
time that running every cell takes."""

from __future__ import annotations

import csv
import time

import nbformat

from course_tools import notebook
from course_tools.grading.grader import grade, mistakes, sandbox, verdicts
from course_tools.grading.sandboxed import worker
from tests.helpers import answered, mutants, write

CHAPTER = "03_transformer"


def _grade(grading, all_cells: bool) -> tuple[float, dict[str, str], nbformat.NotebookNode]:
    start = time.perf_counter()
    path = grade.grade(CHAPTER, grading, jobs=1, unsandboxed=bool(sandbox.unavailable()), all_cells=all_cells)
    seconds = time.perf_counter() - start
    with path.open(encoding="utf-8") as f:
        (row,) = csv.DictReader(f)
    return seconds, row, notebook.read(grading / "autograded" / "ann" / CHAPTER / f"{CHAPTER}.ipynb")


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs)


def test_a_chapter_03_submission_gets_the_same_points_in_a_fraction_of_the_full_run(tmp_path):
    submission = answered(CHAPTER, mutant=mutants(CHAPTER)[0])  # one exercise wrong
    write(submission, tmp_path / "submitted" / "ann" / CHAPTER / f"{CHAPTER}.ipynb")
    verdicts.answer_key(CHAPTER, tmp_path / "keys")  # made once per chapter, before either run
    mistakes.key(CHAPTER, tmp_path / "keys")  # the known mistakes too
    needed_s, needed, needed_nb = _grade(tmp_path, all_cells=False)
    all_s, full, full_nb = _grade(tmp_path, all_cells=True)

    exercises = [ex.name for ex in notebook.exercises(needed_nb)]
    assert {n: needed[n] for n in exercises} == {n: full[n] for n in exercises}
    assert float(needed["autograded"]) < float(needed["autograded_max"])  # the wrong answer lost its points
    demos = notebook.unchanged_demonstrations(submission)
    assert demos and all(_text(needed_nb.cells[i]) == worker.SKIPPED for i in demos)
    assert not any(worker.SKIPPED in _text(full_nb.cells[i]) for i in demos)
    # The full run takes the chapter's book time (31 s on 2 quiet cores) more than grading does.
    # Each run also pays the release, nbgrader's start, the graded runs and the feedback page:
    # 22 s against 60 s on 2 quiet cores.
    assert needed_s < 0.6 * all_s, (needed_s, all_s)
