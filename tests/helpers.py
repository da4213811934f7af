"""Make submissions for tests: a student notebook with some exercises answered."""

from __future__ import annotations

from pathlib import Path

import nbformat

from course_tools import config, notebook
from course_tools.catalogues.mutants import apply as apply_mutant
from course_tools.catalogues.mutants import load_catalogue


def mutants(chapter: str) -> list[dict]:
    """The chapter's catalogue of plausible wrong answers (catalogues/mutants/)."""
    return load_catalogue(chapter, "mutant")


def acceptance(chapter: str) -> list[dict]:
    """The chapter's catalogue of correct answers written differently (catalogues/acceptance/)."""
    return load_catalogue(chapter, "acceptance")


def answered(chapter: str, answer: set[str] | None = None, mutant: dict | None = None):
    """The student notebook with the solution pasted into each exercise in ``answer`` (all if
    None); ``mutant`` (an entry of either catalogue) then changes one of them."""
    student = notebook.read(config.student_path(chapter))
    solution = notebook.read(config.solution_path(chapter))
    sol_cells = {notebook.nbgrader_meta(c).get("grade_id"): c.source for c in solution.cells}
    for cell in student.cells:
        gid = notebook.nbgrader_meta(cell).get("grade_id")
        if cell.cell_type == "code" and notebook.nbgrader_meta(cell).get("solution"):
            if answer is None or gid in answer:
                cell.source = sol_cells[gid]
            if mutant is not None and gid == mutant["grade_id"]:
                cell.source = apply_mutant(mutant, sol_cells[gid])
    return student


def write(nb: nbformat.NotebookNode, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path
