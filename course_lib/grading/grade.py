"""Autograde one chapter for every collected student and write the grades.

Submissions live in ``<grading>/submitted/<student>/<chapter>/<chapter>.ipynb`` (nbgrader's
layout). Grading regenerates the chapter into the gradebook (so a fresh grading folder works),
runs nbgrader's ``autograde`` and ``generate_feedback``, and writes ``<grading>/grades.csv``:
one row per student with the points of each exercise and the total.
"""

from __future__ import annotations

import csv
from pathlib import Path

from . import config, nbgrader_cli, notebook, release


def grade(chapter: str, grading_dir: Path | None = None) -> Path:
    """Autograde ``chapter``; returns the path of the grades CSV."""
    g = Path(grading_dir or config.root() / "grading").resolve()
    submitted = g / "submitted"
    students = [p.parent.name for p in sorted(submitted.glob(f"*/{chapter}")) if p.is_dir()]
    if not students:
        raise SystemExit(f"No submissions of {chapter} under {submitted}/<student>/{chapter}/")
    release.generate(chapter, g / "release", grading_dir=g)
    nbgrader_cli.run("autograde", chapter, "--force", grading_dir=g)
    nbgrader_cli.run("generate_feedback", chapter, "--force", grading_dir=g)
    return write_grades_csv(chapter, students, g)


def write_grades_csv(chapter: str, students: list[str], grading_dir: Path) -> Path:
    """One row per student: points per autograded exercise and per written question (empty until
    graded by hand in the formgrader), the autograded sum and maximum, then the overall ones."""
    from nbgrader.api import Gradebook

    nb = notebook.read(config.solution_path(chapter))
    exercises = [ex.name for ex in notebook.exercises(nb)]
    written = notebook.written_questions(nb)
    rows = []
    with Gradebook(f"sqlite:///{grading_dir / 'gradebook.db'}") as gb:
        for student in students:
            # find_submission_notebook(notebook, assignment, student)
            sub = gb.find_submission_notebook(chapter, chapter, student)
            grades = {g.name.removesuffix(config.TEST_SUFFIX): g for g in sub.grades}
            row = {"student": student, "chapter": chapter}
            row.update({name: grades[name].score for name in exercises})
            row.update({name: grades[name].manual_score for name in written})
            row["autograded"] = sum(row[name] for name in exercises)
            row["autograded_max"] = sum(grades[name].max_score for name in exercises)
            row["total"] = sub.score
            row["max"] = sub.max_score
            rows.append(row)
    path = grading_dir / "grades.csv"
    with path.open("w", newline="") as f:
        fields = ["student", "chapter", *exercises, *written, "autograded", "autograded_max", "total", "max"]
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path
