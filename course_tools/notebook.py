"""The anatomy of a chapter notebook: set-up cells, exercises and their tests.

A chapter notebook (see the template in README.md, "Adding a chapter") has

- cell 0: the install cell, rendered by :func:`install_cell_source` from ``_config.yml``;
- code cells tagged ``setup`` (imports, seeds): every exercise may use them and nothing else;
- exercises: a solution cell with nbgrader metadata ``grade_id: ex_<name>``, ``solution: true``
  and, right after it or later, a locked test cell ``grade_id: ex_<name>_test`` with the points;
- written questions: markdown cells with ``solution: true, grade: true`` (graded by hand).
"""

from __future__ import annotations

import functools
import stat
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_tools import config

HIDDEN_BEGIN, HIDDEN_END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"  # nbgrader's delimiters
HIDDEN_PLACEHOLDER = "# (hidden tests)"


@dataclass(frozen=True)
class Exercise:
    name: str  # grade_id of the solution cell, "ex_<name>"
    solution_cell: int  # index into nb.cells
    test_cell: int
    points: float


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def setup_cells(nb) -> list[int]:
    """Indices of the install cell and the code cells tagged ``setup``."""
    out = []
    for i, cell in enumerate(nb.cells):
        tags = cell.get("metadata", {}).get("tags", [])
        if cell.cell_type == "code" and (i == 0 or config.SETUP_TAG in tags):
            out.append(i)
    return out


def exercises(nb) -> list[Exercise]:
    """The autograded exercises of a notebook, in order, each paired with its test cell."""
    solutions, tests = {}, {}
    for i, cell in enumerate(nb.cells):
        meta = nbgrader_meta(cell)
        gid = meta.get("grade_id", "")
        if cell.cell_type != "code" or not gid.startswith(config.EXERCISE_PREFIX):
            continue
        if meta.get("solution") and not meta.get("grade"):
            solutions[gid] = i
        elif meta.get("grade") and gid.endswith(config.TEST_SUFFIX):
            tests[gid[: -len(config.TEST_SUFFIX)]] = (i, float(meta.get("points", 0)))
    missing = sorted(set(solutions) ^ set(tests))
    if missing:
        raise ValueError(f"Exercises without a solution or test cell: {missing}")
    return [Exercise(name, i, *tests[name]) for name, i in solutions.items()]


def _demonstrations(nb) -> list[int]:
    """Code cells that are neither set-up nor nbgrader cells: the chapter's demonstrations."""
    setup = set(setup_cells(nb))
    return [i for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and i not in setup and not nbgrader_meta(c)]


def unchanged_demonstrations(nb) -> set[int]:
    """Indices of the code cells of ``nb`` that are demonstrations (training runs, figures) of the
    released chapter ``nb`` is a copy of, found by its exercises, left unchanged. No test depends
    on them (exercises are independent by design), so self-check and grading skip them; a cell the
    student added or changed is not one. Empty for a notebook that is no chapter's, or outside the
    course repository."""
    try:
        names = frozenset(ex.name for ex in exercises(nb))
        sources = _released_demonstrations().get(names, frozenset())
    except (ValueError, FileNotFoundError):  # unpaired exercise cells; no course repository
        return set()
    return {i for i in _demonstrations(nb) if nb.cells[i].source in sources}


@functools.cache
def _released_demonstrations() -> dict[frozenset[str], frozenset[str]]:
    """Each released chapter's exercise names -> the sources of its demonstrations (read once)."""
    out = {}
    for chapter in config.chapters():
        released = read(config.student_path(chapter))
        names = frozenset(ex.name for ex in exercises(released))
        if names:
            out[names] = frozenset(released.cells[i].source for i in _demonstrations(released))
    return out


def written_questions(nb) -> list[str]:
    return [
        nbgrader_meta(c)["grade_id"]
        for c in nb.cells
        if c.cell_type == "markdown" and nbgrader_meta(c).get("solution") and nbgrader_meta(c).get("grade")
    ]


def hide_blocks(source: str) -> str:
    """Each hidden block (markers included) becomes one placeholder line, indented like it.

    ``'a\\n### BEGIN HIDDEN TESTS\\nb\\n### END HIDDEN TESTS\\nc'`` -> ``'a\\n# (hidden tests)\\nc'``;
    a block without its end runs to the end of the cell.
    """
    out, hiding = [], False
    for line in source.splitlines():
        if hiding:
            hiding = HIDDEN_END not in line
        elif HIDDEN_BEGIN in line:
            out.append(line[: len(line) - len(line.lstrip())] + HIDDEN_PLACEHOLDER)
            hiding = True
        else:
            out.append(line)
    return "\n".join(out)


def install_cell_source() -> str:
    """Cell 0 of every notebook: installs course_lib where it is missing (Colab), else nothing.

    It also has OpenMP's threads sleep while they wait, before torch loads (as ``config.kernel_env``
    does for the kernels the course starts): on a laptop in a video call or a shared JupyterHub,
    spinning threads made training 5 to 20 times slower. torch is pinned to the version already
    installed, so pip never replaces Colab's build. The
    URL and branch come from ``_config.yml``; ``COURSE_LIB_SOURCE`` overrides them (tests point
    it at a local checkout).
    """
    url, branch = config.repository()
    return f'''# Set-up: installs course_lib when it is missing (e.g. on Colab); does nothing otherwise.
import importlib.util, os, subprocess, sys
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's threads sleep while they wait: \
fast on a busy machine
if importlib.util.find_spec("course_lib") is None:
    from importlib.metadata import PackageNotFoundError, version
    source = os.environ.get("COURSE_LIB_SOURCE", "git+{url}@{branch}")
    try:
        keep = [f"torch=={{version('torch')}}"]  # keep the installed torch as it is
    except PackageNotFoundError:
        keep = []
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    subprocess.run(pip + [source, *keep], check=True)
    subprocess.run(pip + ["--no-deps", "{config.COLAB_CORPUS}"], check=True)
    importlib.invalidate_caches()'''


def read(path) -> nbformat.NotebookNode:
    return nbformat.read(str(path), as_version=4)


def python_source(source: str) -> str:
    """A code cell's source as Python: IPython's magics (``%timeit f(x)``, ``!ls``) become the
    ``get_ipython()`` calls IPython makes of them; plain Python is returned as it is."""
    import ast

    try:
        ast.parse(source)
        return source
    except (SyntaxError, ValueError):
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(source)


ALLOWED_EXTRA = {"timestamp.txt"}  # what nbgrader's own collect puts beside a notebook


def submission_problem(path: Path, chapter: str) -> str | None:
    """Why the submitted notebook ``path`` cannot be graded as ``chapter``, or None if it can
    (grading and the similarity report read submissions through this one check)."""
    folder = path.parent
    others = sorted(p.name for p in folder.iterdir() if p.name != path.name and not (
        p.name in ALLOWED_EXTRA and stat.S_ISREG(p.lstat().st_mode)))
    if others:
        return f"the folder holds more than the notebook ({', '.join(others)[:200]}): collect it again"
    mode = path.lstat()
    if not stat.S_ISREG(mode.st_mode) or mode.st_nlink != 1:
        return "the notebook is not a regular file (a link or a device): collect it again"
    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception as e:  # noqa: BLE001 (any unreadable file gets the same treatment)
        return f"not a valid notebook ({type(e).__name__}: {str(e)[:120]})"
    if not nb.cells:
        return "the notebook is empty"
    expected = {ex.name for ex in exercises(read(config.solution_path(chapter)))}
    found = {nbgrader_meta(c).get("grade_id") for c in nb.cells}
    if not expected & found:
        return f"this is not the {chapter} notebook (none of its exercises {sorted(expected)} is in it)"
    return None
