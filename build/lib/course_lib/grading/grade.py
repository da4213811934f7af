"""Autograde one chapter for every collected student and write the grades.

Submissions live in ``<grading>/submitted/<student>/<chapter>/<chapter>.ipynb`` (nbgrader's
layout; ``collect`` puts them there). Grading

1. regenerates the chapter into the gradebook, so a fresh grading folder works;
2. checks every submission first: a file that is not a notebook, is empty, or belongs to another
   chapter gets a clear message naming the student and file, and 0 points; the others go on;
3. autogrades each student in their own nbgrader process, several at a time, each notebook
   executed in the sandbox of ``sandbox.py``;
4. writes feedback HTML per student, ``<grading>/grades.csv`` (one row per student: points per
   exercise and written question, sums, and any problem) and a summary per exercise (mean score,
   share of full marks) as ``summary.txt`` and ``summary.png``.
"""

from __future__ import annotations

import csv
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

from . import config, nbgrader_cli, notebook, release


def problem_with(path: Path, chapter: str) -> str | None:
    """Why ``path`` cannot be graded as ``chapter``, or None if it can."""
    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception as e:  # noqa: BLE001 (any unreadable file gets the same treatment)
        return f"not a valid notebook ({type(e).__name__}: {str(e)[:120]})"
    if not nb.cells:
        return "the notebook is empty"
    expected = {ex.name for ex in notebook.exercises(notebook.read(config.solution_path(chapter)))}
    found = {notebook.nbgrader_meta(c).get("grade_id") for c in nb.cells}
    if not expected & found:
        return f"this is not the {chapter} notebook (none of its exercises {sorted(expected)} is in it)"
    return None


def grade(chapter: str, grading_dir: Path | None = None, jobs: int | None = None) -> Path:
    """Autograde ``chapter``; returns the path of the grades CSV."""
    g = Path(grading_dir or config.root() / "grading").resolve()
    submitted = g / "submitted"
    students = [p.parent.name for p in sorted(submitted.glob(f"*/{chapter}")) if p.is_dir()]
    if not students:
        raise SystemExit(f"No submissions of {chapter} under {submitted}/<student>/{chapter}/")
    problems = {}
    for student in students:
        path = submitted / student / chapter / f"{chapter}.ipynb"
        problems[student] = problem_with(path, chapter) if path.is_file() else f"no {path.name} in the folder"
        if problems[student]:
            print(f"Cannot grade {student}: {path}: {problems[student]}", flush=True)
    gradable = [s for s in students if not problems[s]]

    release.generate(chapter, g / "release", grading_dir=g)

    def autograde(student: str) -> str | None:
        try:
            only = f"--CourseDirectory.student_id={student}"
            nbgrader_cli.run("autograde", chapter, "--force", only, grading_dir=g)
        except RuntimeError as e:
            return f"autograding failed: {str(e)[-300:]}"
        return None

    jobs = jobs or max(1, min(len(gradable), os.cpu_count() or 1))
    with ThreadPoolExecutor(jobs) as pool:
        for student, failure in zip(gradable, pool.map(autograde, gradable), strict=True):
            if failure:
                problems[student] = failure
                print(f"Cannot grade {student}: {failure}", flush=True)
    if any(not problems[s] for s in students):
        nbgrader_cli.run("generate_feedback", chapter, "--force", grading_dir=g)
    path = write_grades_csv(chapter, students, g, problems)
    write_summary(path)
    return path


def export(chapter: str, grading_dir: Path | None = None) -> Path:
    """Rewrite grades, summary and feedback from the gradebook, e.g. after manual grading."""
    from nbgrader.api import Gradebook, MissingEntry

    g = Path(grading_dir or config.root() / "grading").resolve()
    students = [p.parent.name for p in sorted((g / "submitted").glob(f"*/{chapter}")) if p.is_dir()]
    problems = {}
    with Gradebook(f"sqlite:///{g / 'gradebook.db'}") as gb:
        for student in students:
            try:
                gb.find_submission_notebook(chapter, chapter, student)
                problems[student] = None
            except MissingEntry:
                problems[student] = "not graded (see the output of the grade command)"
    if not any(p is None for p in problems.values()):
        raise SystemExit(f"Nothing of {chapter} has been graded under {g}: run grade first.")
    nbgrader_cli.run("generate_feedback", chapter, "--force", grading_dir=g)
    path = write_grades_csv(chapter, students, g, problems)
    write_summary(path)
    return path


def write_grades_csv(chapter: str, students: list[str], grading_dir: Path,
                     problems: dict[str, str | None]) -> Path:
    """One row per student: points per autograded exercise and per written question (empty until
    graded by hand in the formgrader), the autograded sum and maximum, the overall ones, and the
    problem that stopped grading, if any (then every score is 0)."""
    from nbgrader.api import Gradebook

    nb = notebook.read(config.solution_path(chapter))
    exercises = {ex.name: ex.points for ex in notebook.exercises(nb)}
    written = notebook.written_questions(nb)
    full = sum(exercises.values())
    rows = []
    with Gradebook(f"sqlite:///{grading_dir / 'gradebook.db'}") as gb:
        for student in students:
            row = {"student": student, "chapter": chapter, "problem": problems.get(student) or ""}
            if row["problem"]:
                row.update({name: 0.0 for name in exercises} | {name: "" for name in written})
                row.update(autograded=0.0, autograded_max=full, total=0.0, max="")
            else:
                # find_submission_notebook(notebook, assignment, student)
                sub = gb.find_submission_notebook(chapter, chapter, student)
                grades = {gr.name.removesuffix(config.TEST_SUFFIX): gr for gr in sub.grades}
                row.update({name: grades[name].score for name in exercises})
                row.update({name: grades[name].manual_score for name in written})
                row.update(autograded=sum(row[name] for name in exercises), autograded_max=full,
                           total=sub.score, max=sub.max_score)
            rows.append(row)
    path = grading_dir / "grades.csv"
    with path.open("w", newline="") as f:
        fields = ["student", "chapter", *exercises, *written, "autograded", "autograded_max",
                  "total", "max", "problem"]
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def summarize(grades_csv: Path) -> list[dict]:
    """Per exercise: mean score, its maximum, and the share of students with full marks."""
    with grades_csv.open() as f:
        rows = list(csv.DictReader(f))
    chapter = rows[0]["chapter"]
    nb = notebook.read(config.solution_path(chapter))
    out = []
    for ex in notebook.exercises(nb):
        scores = [float(r[ex.name]) for r in rows]
        out.append({"exercise": ex.name, "points": ex.points, "mean": sum(scores) / len(scores),
                    "full_marks": sum(s >= ex.points for s in scores) / len(scores)})
    return out


def write_summary(grades_csv: Path) -> tuple[Path, Path]:
    """``summary.txt`` (printed too) and ``summary.png`` beside the grades CSV."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stats = summarize(grades_csv)
    width = max(len(s["exercise"]) for s in stats)
    lines = [f"{'exercise':<{width}}  mean / points  full marks"]
    lines += [f"{s['exercise']:<{width}}  {s['mean']:5.2f} / {s['points']:<5g}  {s['full_marks']:6.0%}"
              for s in stats]
    text = grades_csv.with_name("summary.txt")
    text.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(stats)), 3))
    ax.bar([s["exercise"].removeprefix("ex_") for s in stats], [100 * s["full_marks"] for s in stats])
    ax.set_ylabel("students with full marks (%)")
    ax.set_ylim(0, 100)
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    png = grades_csv.with_name("summary.png")
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return text, png
