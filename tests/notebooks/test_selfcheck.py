"""The students' self-check, nbval, and the independence of exercises."""

from __future__ import annotations

import subprocess
import sys
import time

import nbformat
import pytest
from nbclient import NotebookClient

from course_tools import config, notebook
from course_tools.grading.grader import mistakes
from course_tools.student import check
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
    # the catalogue's first mistake, named under the FAIL by the key shipped with the course
    assert results[mutant["grade_id"]].detail.endswith("\n" + mistakes.hint_line(mutant))
    assert not any(mistakes.LEAD in r.detail for name, r in results.items() if name != mutant["grade_id"])


def test_the_chapter_s_unchanged_demonstrations_are_skipped_and_changed_or_added_cells_run():
    chapter = "03_transformer"  # its training run comes before its last exercises
    nb = notebook.read(config.student_path(chapter))
    setup, graded = set(notebook.setup_cells(nb)), {i for ex in notebook.exercises(nb)
                                                    for i in (ex.solution_cell, ex.test_cell)}
    last = max(graded)
    code = [i for i, c in enumerate(nb.cells[:last + 1]) if c.cell_type == "code"]
    demos = [i for i in code if i not in setup | graded]
    training = next(i for i in demos if "train.train(" in nb.cells[i].source)
    _, order = check.cells_to_run(nb)
    assert order == sorted(setup | graded) and training < last
    _, order = check.cells_to_run(nb, all_cells=True)
    assert order == code  # as "Restart and run all" would, up to the last graded cell
    nb.cells[training].source += "\n# a student's note"  # changed: it runs
    nb.cells.insert(training, nbformat.v4.new_code_cell("def helper(): return 1"))  # added: it runs
    _, order = check.cells_to_run(nb)
    assert training in order and training + 1 in order
    assert [i for i in order if i not in (training, training + 1)] == sorted(
        i + (i >= training) for i in setup | graded)
    other = nbformat.v4.new_notebook(cells=[nb.cells[training + 1]])  # no chapter's: every cell runs
    assert notebook.unchanged_demonstrations(other) == set()
    unpaired = notebook.read(config.student_path(chapter))
    unpaired.cells = [c for c in unpaired.cells if not notebook.nbgrader_meta(c).get("grade")]
    assert notebook.unchanged_demonstrations(unpaired) == set()  # no exception: everything runs


def test_cli_names_each_exercise_and_exits_nonzero_on_failure(tmp_path):
    chapter = CHAPTERS[0]
    proc = subprocess.run(
        [sys.executable, "-m", "course_tools.student.check", str(config.student_path(chapter))],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert proc.returncode == 1
    for ex in notebook.exercises(notebook.read(config.student_path(chapter))):
        assert f"{ex.name}" in proc.stdout and "TODO" in proc.stdout
    nb = answered(chapter)
    written = set(notebook.written_questions(nb))
    assert written  # chapter 01 has one: unanswered, the exit code is still 1
    path = write(nb, tmp_path / chapter / f"{chapter}.ipynb")
    proc = subprocess.run([sys.executable, "-m", "course_tools.student.check", str(path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1 and "written questions still TODO" in proc.stdout, proc.stdout + proc.stderr
    for cell in nb.cells:
        if notebook.nbgrader_meta(cell).get("grade_id") in written:
            cell.source = "Bytes: every text is a sequence of the 256 byte values."
    path = write(nb, tmp_path / chapter / f"{chapter}.ipynb")
    proc = subprocess.run([sys.executable, "-m", "course_tools.student.check", str(path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout and "ANSWERED" in proc.stdout


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
    """Setup cells + one solution + its full (hidden included) tests, nothing else, pass. One kernel
    serves the chapter: before each exercise its namespace is emptied (``%reset -f``) and the set-up
    cells run again, so no name of another exercise or of the narrative is left to lean on."""
    nb = notebook.read(config.solution_path(chapter))
    setup = [nb.cells[i] for i in notebook.setup_cells(nb)]
    alone = nbformat.v4.new_notebook(metadata=nb.metadata)
    for ex in notebook.exercises(nb):
        alone.cells += [nbformat.v4.new_code_cell("%reset -f"), *setup,
                        nb.cells[ex.solution_cell], nb.cells[ex.test_cell]]
    client = NotebookClient(alone, timeout=config.cell_timeout(), kernel_name="python3",
                            resources={"metadata": {"path": str(config.solution_path(chapter).parent)}})
    client.execute()  # raises CellExecutionError naming the cell if an exercise is not independent


def test_the_reset_between_exercises_leaves_no_name_behind():
    alone = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in (
        "leaked = 1", "%reset -f", "assert 'leaked' not in globals()")])
    NotebookClient(alone, timeout=60, kernel_name="python3").execute()


# The self-check's report, on small notebooks made here: cell 0 is the set-up cell, then one
# exercise "double" (a solution cell and its test cell) per (solution, test) pair.

def _exercise_cells(name: str, solution: str, test: str) -> list:
    sol = nbformat.v4.new_code_cell(solution)
    sol.metadata["nbgrader"] = {"grade_id": f"ex_{name}", "solution": True, "grade": False, "locked": False,
                                "schema_version": 3}
    tst = nbformat.v4.new_code_cell(test)
    tst.metadata["nbgrader"] = {"grade_id": f"ex_{name}_test", "solution": False, "grade": True,
                                "locked": True, "points": 1, "schema_version": 3}
    return [sol, tst]


def _notebook(path, *exercises, written: str | None = None, after: str | None = None):
    cells = [nbformat.v4.new_code_cell("import pathlib, time")]
    for name, solution, test in exercises:
        cells += _exercise_cells(name, solution, test)
    if written is not None:
        cell = nbformat.v4.new_markdown_cell(written)
        cell.metadata["nbgrader"] = {"grade_id": "ex_why", "solution": True, "grade": True, "locked": False,
                                     "points": 1, "schema_version": 3}
        cells.append(cell)
    if after is not None:
        cells.append(nbformat.v4.new_code_cell(after))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return write(nb, path)


DOUBLE_TEST = "x = 4\nassert double(x) == 8\nassert double(0) == 0"
DOUBLE = ("double", "def double(x):\n    return 2 * x", DOUBLE_TEST)  # a right answer


def test_a_bare_assert_fails_with_its_line_and_the_values_it_compared(tmp_path):
    path = _notebook(tmp_path / "nb.ipynb", ("double", "def double(x):\n    return x * 3", DOUBLE_TEST))
    [result] = check.check(path)
    assert result.status == "FAIL"
    assert result.detail.splitlines() == ["AssertionError", "the test, line 2: assert double(x) == 8",
                                          "  double(x) = 12"]


def test_an_error_inside_the_solution_names_the_solution_s_line(tmp_path):
    solution = "def double(x):\n    y = x\n    return y.twice()"
    path = _notebook(tmp_path / "nb.ipynb", ("double", solution, DOUBLE_TEST))
    [result] = check.check(path)
    assert result.status == "FAIL"
    assert result.detail.splitlines() == ["AttributeError: 'int' object has no attribute 'twice'",
                                          "your solution, line 3: return y.twice()"]


def test_a_cell_past_the_limit_fails_by_name_and_the_next_exercise_still_runs(tmp_path):
    slow = ("slow", "def slow():\n    return 1\nend = time.time() + 60\nwhile time.time() < end:\n    pass",
            "assert slow() == 1")
    path = _notebook(tmp_path / "nb.ipynb", slow, DOUBLE)
    start = time.monotonic()
    results = check.check(path, timeout=3)
    assert time.monotonic() - start < 40  # interrupted after 3 CPU seconds, not left to run for 60
    assert [(r.exercise, r.status) for r in results] == [("ex_slow", "FAIL"), ("ex_double", "PASS")]
    assert results[0].detail == "your solution: the cell ran past its limit of 3 CPU seconds"


def test_an_answer_that_uses_a_helper_from_another_cell_fails_as_it_does_for_the_grader(tmp_path):
    """The grader runs each answer with the set-up cells only, so the helper is missing there: the
    self-check runs it the same way and says FAIL, with the grader's words and the reason."""
    borrowing = ("double", "def double(x):\n    return times(x, 2)", DOUBLE_TEST)
    path = _notebook(tmp_path / "nb.ipynb", borrowing)
    nb = notebook.read(path)
    nb.cells.insert(1, nbformat.v4.new_code_cell("def times(a, b):\n    return a * b\n%timeit 1"))
    nb.cells.insert(1, nbformat.v4.new_code_cell("def times(a, b):\n    return a * b"))
    write(nb, path)
    [result] = check.check(path)
    assert result.status == "FAIL"
    assert result.detail.splitlines() == [
        "the grader runs this answer with the set-up cells only, and there: NameError: name 'times' is not "
        "defined (raised at line 2 of the answer)",
        "it uses `times` from another cell: define them in the answer's cell"]
    kept = ("double", "def times(a, b):\n    return a * b\n\ndef double(x):\n    return times(x, 2)\n"
            "%timeit double(1)", DOUBLE_TEST)
    assert [(r.status, r.detail)
            for r in check.check(_notebook(tmp_path / "ok.ipynb", kept))] == [("PASS", "")]


@pytest.mark.parametrize("answer, words", [
    ("import sys\ndef double(x):\n    sys._getframe()\n    return 2 * x",
     "PermissionError: sys._getframe is not allowed while an answer is graded "
     "(raised at line 3 of the answer)"),
    ("%pip list\ndef double(x):\n    return 2 * x", "the IPython magic %pip is not run by the grader"),
])
def test_what_the_grader_refuses_the_self_check_refuses_with_the_same_words(tmp_path, answer, words):
    [result] = check.check(_notebook(tmp_path / "nb.ipynb", ("double", answer, DOUBLE_TEST)))
    assert result.status == "FAIL" and words in result.detail, result


def test_cells_after_the_last_graded_cell_do_not_run(tmp_path):
    marker = tmp_path / "ran"
    path = _notebook(tmp_path / "nb.ipynb", DOUBLE,
                     after=f"pathlib.Path({str(marker)!r}).write_text('ran')")
    assert [r.status for r in check.check(path)] == ["PASS"]
    assert not marker.exists()


@pytest.mark.parametrize("answer, status, code", [("YOUR ANSWER HERE", "TODO", 1), ("", "TODO", 1),
                                                  ("Because the variance grows with d.", "ANSWERED", 0)])
def test_written_questions_are_todo_until_answered_and_count_in_the_exit_code(tmp_path, answer, status, code):
    path = _notebook(tmp_path / "nb.ipynb", DOUBLE,
                     written=answer)
    assert [(r.exercise, r.status) for r in check.written(path)] == [("ex_why", status)]
    proc = subprocess.run([sys.executable, "-m", "course_tools.student.check", str(path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == code, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("Self-check: 1 of 1 exercises pass")
    assert ("written questions still TODO" in last) == (status == "TODO")
    assert proc.stderr == ""  # no kernel warnings, no tracebacks from the runner


def test_the_cli_explains_itself_without_a_notebook_and_checks_a_folder(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "course_tools.student.check"], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 2 and "make check NB=" in proc.stdout and "--exercise" in proc.stdout
    for name in ("a", "b"):
        _notebook(tmp_path / name / f"{name}.ipynb", DOUBLE)
    proc = subprocess.run([sys.executable, "-m", "course_tools.student.check", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("Self-check: 1 of 1 exercises pass") == 2
    assert str(tmp_path / "a" / "a.ipynb") in proc.stdout and str(tmp_path / "b" / "b.ipynb") in proc.stdout


def test_one_exercise_alone_runs_on_the_setup_cells(tmp_path):
    chapter = "02_attention"
    wrong = next(m for m in mutants(chapter) if m["grade_id"] == "ex_causal_mask" and "float" in m["why"])
    path = write(answered(chapter, mutant=wrong), tmp_path / chapter / f"{chapter}.ipynb")
    [result] = check.check(path, exercise="causal_mask")
    assert result.exercise == "ex_causal_mask" and result.status == "FAIL"
    assert "dtype torch.bool" in result.detail and "the test, line" in result.detail
    assert result.detail.endswith(mistakes.hint_line(wrong))
    assert [r.status for r in check.check(path, exercise="ex_rope")] == ["PASS"]
    with pytest.raises(ValueError, match="no exercise 'causal'.*causal_mask"):
        check.check(path, exercise="causal")
