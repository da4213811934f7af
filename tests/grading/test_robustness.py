"""One student's notebook never breaks the class: real nbgrader runs on hostile submissions.

Students (each a copy of the right answers, then broken in one way per exercise):
- ``broken``: ex 1 loops forever, ex 2 has a syntax error, ex 3 kills the kernel, ex 4 imports
  a missing module, ex 5 raises; the last exercise is right and must keep its points;
- ``tamperer``: wrong answers everywhere, with test cells deleted, emptied, duplicated and
  moved: the instructor's tests count, so no points; ``rearranger``: the same tampering with
  right answers: full marks;
- ``snoop``: right answers, plus a cell that tries to read the solutions and the gradebook and
  to write outside its folder, prints huge output and allocates too much memory;
- ``not_json``, ``empty``, ``other_chapter``: files that are no submission of this chapter;
- ``perfect``: graded normally despite all of the above.
Then the same submissions are graded again: identical scores.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys

import nbformat
import pytest

from course_lib.grading import config, notebook, sandbox
from tests.conftest import CHAPTERS, ROOT, skip_or_fail
from tests.helpers import answered, mutants, write

CHAPTER = CHAPTERS[0]
CELL_TIMEOUT = "30"  # seconds: short, but room for the set-up imports on a busy machine


def _cell(nb, grade_id):
    return next(c for c in nb.cells if notebook.nbgrader_meta(c).get("grade_id") == grade_id)


def _exercises():
    return notebook.exercises(notebook.read(config.solution_path(CHAPTER)))


def _broken():
    nb = answered(CHAPTER)
    names = [ex.name for ex in _exercises()]
    sabotage = ["while True:\n    pass", "def broken(:\n    pass", "import os\nos._exit(1)",
                "import not_a_module_anywhere", "raise RuntimeError('student bug')"]
    for name, bad in zip(names[:-1], sabotage, strict=False):
        _cell(nb, name).source = bad + "\n" + _cell(nb, name).source
    return nb, names[len(sabotage)]


def _tampered(right_answers: bool):
    nb = answered(CHAPTER)
    for m in [] if right_answers else mutants(CHAPTER):  # one wrong answer in every exercise
        cell = _cell(nb, m["grade_id"])
        if m["find"] in cell.source and "mutated" not in cell.metadata:
            cell.source = cell.source.replace(m["find"], m["replace"], 1)
            cell.metadata["mutated"] = True
    tests = [_cell(nb, ex.name + config.TEST_SUFFIX) for ex in _exercises()]
    nb.cells.remove(tests[0])                      # deleted
    tests[1].source = "pass"                        # emptied
    nb.cells.insert(0, nbformat.from_dict(dict(tests[2])))  # duplicated, first
    nb.cells.remove(tests[3])
    nb.cells.append(tests[3])                       # moved to the end
    return nb


def _snoop(grading):
    nb = answered(CHAPTER)
    probe = f"""
import os, pathlib
secrets = [{str(config.solution_path(CHAPTER))!r}, {str(grading / 'gradebook.db')!r},
           {str(grading / 'submitted' / 'perfect')!r}, {str(ROOT / 'tests' / 'mutants')!r}]
print("SEEN", [s for s in secrets if os.path.exists(s) and (os.path.isfile(s) or os.listdir(s))])
for target in [{str(ROOT / 'pwned.txt')!r}, {str(grading / 'pwned.txt')!r}]:
    try:
        pathlib.Path(target).write_text("x")
        print("WROTE", target)
    except OSError:
        pass
print(list(range(10**6)))
"""
    nb.cells.insert(3, nbformat.v4.new_code_cell(probe))
    nb.cells.insert(4, nbformat.v4.new_code_cell("block = bytearray(64 * 2**30)"))
    return nb


def _grade(grading):
    env = {**os.environ, "COURSE_CELL_TIMEOUT": CELL_TIMEOUT}
    proc = subprocess.run(
        ["make", "-o", ".venv/.installed", "grade", f"CHAPTER={CHAPTER}", f"GRADING={grading}",
         f"PY={sys.executable}"], cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with (grading / "grades.csv").open() as f:
        return {row["student"]: row for row in csv.DictReader(f)}, proc.stdout


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    if not sandbox.bwrap_available():
        skip_or_fail("bubblewrap is not installed (apt-get install bubblewrap)")
    grading = tmp_path_factory.mktemp("robust") / "grading"
    target = f"{CHAPTER}/{CHAPTER}.ipynb"
    sub = grading / "submitted"
    broken, survivor = _broken()
    write(broken, sub / "broken" / target)
    write(_tampered(right_answers=False), sub / "tamperer" / target)
    write(_tampered(right_answers=True), sub / "rearranger" / target)
    write(_snoop(grading), sub / "snoop" / target)
    write(answered(CHAPTER), sub / "perfect" / target)
    (sub / "not_json" / CHAPTER).mkdir(parents=True)
    (sub / "not_json" / target).write_text("{this is not json")
    write(nbformat.v4.new_notebook(), sub / "empty" / target)
    other = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    other.cells[0].metadata["nbgrader"] = {"grade_id": "ex_something_else", "solution": True}
    write(other, sub / "other_chapter" / target)
    first, stdout = _grade(grading)
    second, _ = _grade(grading)
    return grading, first, second, stdout, survivor


def _points():
    return {ex.name: ex.points for ex in _exercises()}


def test_broken_cells_cost_only_their_exercises(graded):
    _, rows, _, _, survivor = graded
    row = rows["broken"]
    assert float(row[survivor]) == _points()[survivor]
    assert all(float(row[n]) == 0 for n in _points() if n != survivor)
    assert row["problem"] == ""


def test_tampered_tests_earn_nothing(graded):
    _, rows, _, _, _ = graded
    assert float(rows["tamperer"]["autograded"]) == 0


def test_deleted_emptied_duplicated_or_moved_tests_still_grade_right_answers(graded):
    _, rows, _, _, _ = graded
    assert float(rows["rearranger"]["autograded"]) == sum(_points().values())


def test_hidden_files_stay_hidden_and_nothing_is_written_outside(graded):
    grading, rows, _, _, _ = graded
    assert float(rows["snoop"]["autograded"]) == sum(_points().values())
    executed = notebook.read(grading / "autograded" / "snoop" / CHAPTER / f"{CHAPTER}.ipynb")
    text = "\n".join(o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.outputs)
    assert "SEEN []" in text
    assert "WROTE" not in text
    assert not (ROOT / "pwned.txt").exists() and not (grading / "pwned.txt").exists()
    assert "output truncated" in text  # the huge print was cut
    errors = [o.ename for c in executed.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert "MemoryError" in errors or "DeadKernelError" in errors


def test_bad_files_get_a_clear_message_naming_student_and_file(graded):
    _, rows, _, stdout, _ = graded
    for student, words in [("not_json", "not a valid notebook"), ("empty", "empty"),
                           ("other_chapter", f"not the {CHAPTER} notebook")]:
        assert words in rows[student]["problem"]
        assert float(rows[student]["autograded"]) == 0
        assert f"Cannot grade {student}:" in stdout and f"{student}/{CHAPTER}" in stdout


def test_the_rest_of_the_class_is_graded_normally(graded):
    _, rows, _, _, _ = graded
    assert float(rows["perfect"]["autograded"]) == sum(_points().values())


def test_grading_twice_gives_identical_scores(graded):
    _, first, second, _, _ = graded
    assert first == second
