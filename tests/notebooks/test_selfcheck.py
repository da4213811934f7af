"""The students' self-check, nbval, and the independence of exercises."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from course_lib.grading import check, config, notebook
from tests.conftest import CHAPTERS, ROOT
from tests.helpers import answered, mutants, write


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_untouched_notebook_reports_every_exercise_todo(chapter):
    results = check.check(config.student_path(chapter))
    names = [ex.name for ex in notebook.exercises(notebook.read(config.student_path(chapter)))]
    assert [r.exercise for r in results] == names
    assert {r.status for r in results} == {"TODO"}


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_answered_notebook_passes_and_one_wrong_answer_fails_only_that_one(chapter, tmp_path):
    mutant = mutants(chapter)[0]
    path = write(answered(chapter, mutant=mutant), tmp_path / chapter / f"{chapter}.ipynb")
    results = {r.exercise: r for r in check.check(path)}
    assert results[mutant["grade_id"]].status == "FAIL"
    assert all(r.status == "PASS" for name, r in results.items() if name != mutant["grade_id"])


def test_cli_names_each_exercise_and_exits_nonzero_on_failure(tmp_path):
    chapter = CHAPTERS[0]
    proc = subprocess.run(
        [sys.executable, "-m", "course_lib.grading.check", str(config.student_path(chapter))],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert proc.returncode == 1
    for ex in notebook.exercises(notebook.read(config.student_path(chapter))):
        assert f"{ex.name}" in proc.stdout and "TODO" in proc.stdout
    path = write(answered(chapter), tmp_path / chapter / f"{chapter}.ipynb")
    proc = subprocess.run([sys.executable, "-m", "course_lib.grading.check", str(path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout


def test_nbval_lax_runs_a_notebook():
    chapter = CHAPTERS[0]
    solution = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
         str(config.solution_path(chapter))],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert solution.returncode == 0, solution.stdout[-3000:]
    student = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
         str(config.student_path(chapter))],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert student.returncode == 1 and "NotImplementedError" in student.stdout


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_exercise_runs_alone_on_the_setup_cells(chapter):
    """Setup cells + one solution + its full (hidden included) tests, nothing else, pass."""
    nb = notebook.read(config.solution_path(chapter))
    setup = [nb.cells[i] for i in notebook.setup_cells(nb)]
    for ex in notebook.exercises(nb):
        alone = nbformat.v4.new_notebook(metadata=nb.metadata)
        alone.cells = setup + [nb.cells[ex.solution_cell], nb.cells[ex.test_cell]]
        client = NotebookClient(alone, timeout=config.cell_timeout(), kernel_name="python3",
                                resources={"metadata": {"path": str(config.solution_path(chapter).parent)}})
        client.execute()  # raises CellExecutionError naming the cell if the exercise is not independent
