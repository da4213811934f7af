"""The install cell, in a fresh virtual environment without course_lib (as on Colab).

The environment gets torch first (Colab has it); the install cell, pointed at this checkout
through COURSE_LIB_SOURCE, must install course_lib without replacing torch, and do nothing when
run again. Then, for every student notebook: its install cell, its set-up cells and every
import statement in it run in that environment, so a chapter cannot depend on a package that
only the course's own environment has.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import venv

import pytest

from course_tools import config, notebook
from tests.conftest import CHAPTERS, ROOT


def _run(python, code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=ROOT.parent,
                          env={**os.environ, **env}, timeout=900)


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    """``(python, torch version before, result of the first install)`` of the fresh environment."""
    env_dir = tmp_path_factory.mktemp("colab") / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    import torch

    pip = subprocess.run([str(python), "-m", "pip", "install", "--quiet", f"torch=={torch.__version__}"],
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    before = _run(python, "import torch; print(torch.__version__)").stdout
    assert _run(python, "import course_lib").returncode != 0  # really absent
    install = notebook.read(config.student_path(CHAPTERS[0])).cells[0].source
    return python, before, _run(python, install, COURSE_LIB_SOURCE=str(ROOT))


def _imports(nb) -> list[str]:
    """Every import statement in the notebook's code cells, at any depth, as source lines."""
    lines = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:  # a cell with IPython magics: those are not imports
            continue
        lines += [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return list(dict.fromkeys(lines))


@pytest.mark.slow
def test_install_cell_installs_course_lib_and_keeps_torch(colab, tmp_path):
    python, before, first = colab
    assert first.returncode == 0, first.stdout + first.stderr
    after = _run(python, "import torch, course_lib; print(torch.__version__)")
    assert after.returncode == 0, after.stderr
    assert after.stdout == before, "the install cell replaced torch"
    # what a notebook needs at run time is installed; the instructors' grading and book build are not
    runtime = _run(python, "import course_tools, course_tools.student.checks, course_tools.student.glue; "
                           "print(course_tools.__file__)")
    assert runtime.returncode == 0 and str(ROOT) not in runtime.stdout, runtime.stdout + runtime.stderr
    for tooling in ("course_tools.grading", "course_tools.book", "course_tools.catalogues"):
        assert _run(python, f"import {tooling}").returncode != 0, f"{tooling} was installed"
    # Installed now: a second run does nothing (a bogus source would make pip fail).
    install = notebook.read(config.student_path(CHAPTERS[0])).cells[0].source
    again = _run(python, install, COURSE_LIB_SOURCE=str(tmp_path / "does-not-exist"))
    assert again.returncode == 0, again.stderr


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_student_notebook_sets_up_and_imports_in_the_fresh_environment(colab, chapter):
    python, _, first = colab
    assert first.returncode == 0, first.stdout + first.stderr
    nb = notebook.read(config.student_path(chapter))
    imports = _imports(nb)
    assert any("course_lib" in line for line in imports), "the notebook imports nothing from course_lib"
    code = "\n".join([nb.cells[i].source for i in notebook.setup_cells(nb)] + imports)
    result = _run(python, code, MPLBACKEND="Agg")
    assert result.returncode == 0, result.stdout + result.stderr
