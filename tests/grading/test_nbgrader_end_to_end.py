"""nbgrader end to end, through the make target an instructor uses, in a temporary course folder.

Students: one hands in the untouched notebook, one the right answers, one the right answers but
for a single plausible wrong one (the first mutant of the chapter's catalogue), one the right
answers but for one written differently (the last entry of the acceptance catalogue), one
with the last mutant (a sample of the in-process verdicts), and one the right answers with a
demonstration cell of the chapter changed.
"""

from __future__ import annotations

import csv
import html
import os
import shutil
import subprocess
import sys

import pytest

from course_tools import config, notebook
from course_tools.catalogues import mutants as mutant_grader
from course_tools.grading.grader import grade, mistakes
from course_tools.grading.sandboxed import worker
from tests.conftest import CHAPTERS, ROOT
from tests.helpers import acceptance, answered, mutants, write

CHAPTER = CHAPTERS[0]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    grading = tmp_path_factory.mktemp("course") / "grading"
    target = f"{CHAPTER}/{CHAPTER}.ipynb"
    shutil.copytree(config.student_path(CHAPTER).parent, grading / "submitted" / "untouched" / CHAPTER)
    write(answered(CHAPTER), grading / "submitted" / "perfect" / target)
    mutant = mutants(CHAPTER)[0]
    write(answered(CHAPTER, mutant=mutant), grading / "submitted" / "one_wrong" / target)
    # A sample of the catalogue (the last mutant, of another exercise) graded by nbgrader too.
    write(answered(CHAPTER, mutant=mutants(CHAPTER)[-1]), grading / "submitted" / "sampled" / target)
    write(answered(CHAPTER, mutant=acceptance(CHAPTER)[-1]), grading / "submitted" / "other_right" / target)
    tinkered = answered(CHAPTER)
    demo = min(notebook.unchanged_demonstrations(tinkered))
    tinkered.cells[demo].source += ('\nimport os\n'
                                    'print("TINKERED", os.environ.get("OMP_NUM_THREADS"), '
                                    'torch.get_num_threads())')
    write(tinkered, grading / "submitted" / "tinkerer" / target)
    proc = subprocess.run(
        ["make", "-o", ".venv/.installed", "grade", f"CHAPTER={CHAPTER}", f"GRADING={grading}",
         f"PY={sys.executable}"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with (grading / "grades" / f"{CHAPTER}.csv").open() as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    return grading, rows, mutant


def _points() -> dict[str, float]:
    nb = notebook.read(config.solution_path(CHAPTER))
    return {ex.name: ex.points for ex in notebook.exercises(nb)}


def test_untouched_notebook_scores_zero(graded):
    _, rows, _ = graded
    assert float(rows["untouched"]["autograded"]) == 0
    assert all(float(rows["untouched"][name]) == 0 for name in _points())


def test_solution_scores_full_marks(graded):
    _, rows, _ = graded
    points = _points()
    assert float(rows["perfect"]["autograded"]) == sum(points.values())
    assert float(rows["perfect"]["autograded_max"]) == sum(points.values())
    assert all(float(rows["perfect"][name]) == p for name, p in points.items())


def test_one_wrong_answer_loses_exactly_that_exercise(graded):
    _, rows, mutant = graded
    points = _points()
    wrong = mutant["grade_id"]
    assert float(rows["one_wrong"][wrong]) == 0
    assert all(float(rows["one_wrong"][n]) == p for n, p in points.items() if n != wrong)
    assert float(rows["one_wrong"]["autograded"]) == sum(points.values()) - points[wrong]


def test_a_correct_answer_written_differently_gets_full_marks(graded):
    _, rows, _ = graded
    assert float(rows["other_right"]["autograded"]) == sum(_points().values()), acceptance(CHAPTER)[-1]["why"]


def test_in_process_verdicts_agree_with_nbgrader(graded):
    """The fast self-test and real nbgrader agree on the sampled answers, right and wrong."""
    _, rows, _ = graded
    verdicts = mutant_grader.grade(CHAPTER)
    wrong = [v for v in verdicts if v.kind == "mutant"]
    right = [v for v in verdicts if v.kind == "acceptance"]
    points = _points()
    for student, verdict in [("one_wrong", wrong[0]), ("sampled", wrong[-1]), ("other_right", right[-1])]:
        lost = float(rows[student][verdict.grade_id]) < points[verdict.grade_id]
        assert verdict.failed == lost, (student, verdict.why)


def _stdout(student: str, grading) -> dict[str, str]:
    """Each code cell's source -> its printed output, in the student's graded notebook."""
    nb = notebook.read(grading / "autograded" / student / CHAPTER / f"{CHAPTER}.ipynb")
    return {c.source: "".join(o.get("text", "") for o in c.outputs)
            for c in nb.cells if c.cell_type == "code"}


def test_unchanged_demonstrations_are_not_run_and_a_changed_one_is(graded):
    grading, rows, _ = graded
    released = notebook.read(config.student_path(CHAPTER))
    demos = [released.cells[i].source for i in notebook.unchanged_demonstrations(released)]
    assert demos
    perfect, tinkerer = _stdout("perfect", grading), _stdout("tinkerer", grading)
    assert all(perfect[source] == worker.SKIPPED for source in demos)
    changed = next(source for source in tinkerer if "TINKERED" in source)
    assert "TINKERED" in tinkerer[changed] and worker.SKIPPED not in tinkerer[changed]
    assert float(rows["tinkerer"]["autograded"]) == sum(_points().values())


def test_students_graded_at_once_share_the_cpus(graded):
    """Six students, graded as many at once as there are CPUs: torch in each sandbox has its share
    of them (one thread on 2 cores), unless the instructor's environment says otherwise."""
    grading, _, _ = graded
    cpus = grade.usable_cpus()
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, cpus // min(6, cpus)))
    printed = next(text for text in _stdout("tinkerer", grading).values() if "TINKERED" in text)
    assert f"TINKERED {threads} {threads}\n" in printed, printed


def test_feedback_is_written_for_every_student(graded):
    grading, rows, _ = graded
    for student in rows:
        assert (grading / "feedback" / student / CHAPTER / f"{CHAPTER}.html").is_file()


def test_summary_per_exercise_as_text_and_plot(graded):
    grading, rows, _ = graded
    text = (grading / "grades" / f"{CHAPTER}-summary.txt").read_text()
    for name in _points():
        assert name in text
    assert (grading / "grades" / f"{CHAPTER}-summary.png").read_bytes()[:4] == b"\x89PNG"


def test_a_known_mistake_is_named_in_the_feedback_the_table_and_the_summary(graded):
    """The one wrong answer is the first mistake of the catalogue: its student reads the hint under
    the failed test, the table names it, and the summary counts it with the class's other
    mistakes (the sampled student's) and the untouched notebook's exercises as not answered."""
    grading, rows, mutant = graded
    page = (grading / "feedback" / "one_wrong" / CHAPTER / f"{CHAPTER}.html").read_text(encoding="utf-8")
    assert html.escape(mistakes.LEAD + mutant["hint"], quote=False) in page.replace("&#39;", "'")
    assert rows["one_wrong"]["mistakes"] == f"{mutant['grade_id']}: {mutant['why']}"
    assert rows["perfect"]["mistakes"] == rows["untouched"]["mistakes"] == ""
    last = mutants(CHAPTER)[-1]
    assert rows["sampled"]["mistakes"] == f"{last['grade_id']}: {last['why']}"
    text = (grading / "grades" / f"{CHAPTER}-summary.txt").read_text()
    assert f"     1  {mutant['why']}\n" in text and f"     1  {last['why']}\n" in text
    assert text.count("     1  (not answered)") == len(_points())


def test_manual_grades_reach_the_csv_after_export(graded):
    """What the formgrader does, through nbgrader's API: score a written answer, then export."""
    from nbgrader.api import Gradebook

    grading, _, _ = graded
    written = notebook.written_questions(notebook.read(config.solution_path(CHAPTER)))
    assert written, "the chapter needs a written question graded by hand"
    with Gradebook(f"sqlite:///{grading / 'gradebook.db'}") as gb:
        sub = gb.find_submission_notebook(CHAPTER, CHAPTER, "perfect")
        grade = next(g for g in sub.grades if g.name == written[0])
        grade.manual_score = grade.max_score
        gb.db.commit()
        max_written = grade.max_score
    proc = subprocess.run(
        ["make", "-o", ".venv/.installed", "export", f"CHAPTER={CHAPTER}", f"GRADING={grading}",
         f"PY={sys.executable}"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with (grading / "grades" / f"{CHAPTER}.csv").open() as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    assert float(rows["perfect"][written[0]]) == max_written
    assert float(rows["perfect"]["total"]) == sum(_points().values()) + max_written
    assert float(rows["untouched"]["autograded"]) == 0
