"""Release: regenerate the student notebooks in ``notebooks/`` from ``solutions/``.

The solution notebook is the only source of a chapter. Releasing first makes its cell 0 the
install cell of ``notebook.install_cell_source`` (so the repository URL lives in ``_config.yml``
alone), then runs nbgrader's ``generate_assignment``, which strips solutions and hidden tests,
clears outputs and records checksums for autograding; last, the MyST markup of the ordinary
markdown cells becomes plain Markdown (:mod:`.markup`), which JupyterLab and Colab render.

The numbers the prose quotes with ``{glue:text}`` become the values of the book build's run
(:mod:`.glue`): releasing copies the last build's values of the chapter, when there are any, into
the committed record ``book/measured/NN_name.json``, and the student notebook is written from that
record, so that regenerating it later (the sync test) gives the same file. Release refuses values
measured by code that has changed since (:func:`.glue_records.check_current`).

Last, release makes the self-check's mistake key of the chapter from the notebook it wrote
(:func:`.mistakes.write_visible`): the catalogue's mistakes recorded by the visible tests.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from pathlib import Path

import nbformat

from course_tools import config, notebook
from course_tools.book import glue_records, markup
from course_tools.grading.grader import mistakes, nbgrader_cli


def sync_install_cell(chapter: str) -> bool:
    """Make cell 0 of the solution the current install cell; True if the file changed."""
    path = config.solution_path(chapter)
    nb = notebook.read(path)
    want = notebook.install_cell_source()
    first = nb.cells[0] if nb.cells else None
    if first is not None and first.cell_type == "code" and first.source == want:
        return False
    cell = nbformat.v4.new_code_cell(want)
    cell.pop("id", None)
    if first is not None and first.cell_type == "code" and "import importlib.util" in first.source:
        nb.cells[0].source = want
    else:
        nb.cells.insert(0, cell)
    nbformat.write(nb, str(path))
    return True


def generate(chapter: str, release_dir: Path, grading_dir: Path | None = None) -> Path:
    """Student version of ``chapter`` written under ``release_dir/chapter/``; returns the file."""
    nbgrader_cli.run(
        "generate_assignment", chapter, "--force", "--create",
        grading_dir=grading_dir, release_dir=release_dir,
    )
    path = Path(release_dir) / chapter / f"{chapter}.ipynb"
    recorded = glue_records.read(glue_records.record_path(chapter))
    markup.plain_notebook(path, recorded)  # MyST Lab would show the roles raw
    nb = notebook.read(path)
    nb.metadata.update(copy.deepcopy(config.STUDENT_METADATA))  # as the student's kernel reports it
    nbformat.write(nb, str(path))
    return path


def release(chapter: str) -> Path:
    """Regenerate ``notebooks/<chapter>/`` from the solution, replacing what was there."""
    sync_install_cell(chapter)
    built, record = glue_records.build_path(chapter), glue_records.record_path(chapter)
    if built.is_file():  # the last build's values become the record, if this code measured them
        glue_records.check_current(built, chapter)
        glue_records.write(record, glue_records.read(built), glue_records.measured_with(built))
    elif glue_records.read(record):
        glue_records.check_current(record, chapter)
    with tempfile.TemporaryDirectory() as tmp:
        generate(chapter, Path(tmp), grading_dir=Path(tmp) / "grading")
        target = config.root() / "notebooks" / chapter
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(Path(tmp) / chapter, target)
    mistakes.write_visible(chapter)  # the self-check's key, from the notebook just written
    return config.student_path(chapter)
