"""The install cell, in a fresh virtual environment without course_lib (as on Colab).

The environment gets torch first (Colab has it); the cell, pointed at this checkout through
COURSE_LIB_SOURCE, must install course_lib without replacing torch, after which the notebook's
set-up cells run. Run again, the cell must do nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv

import pytest

from course_lib.grading import config, notebook
from tests.conftest import CHAPTERS, ROOT


def _run(python, code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=ROOT.parent,
                          env={**os.environ, **env}, timeout=900)


@pytest.mark.slow
def test_install_cell_installs_course_lib_and_keeps_torch(tmp_path):
    env_dir = tmp_path / "colab"
    venv.create(env_dir, with_pip=True)
    python = env_dir / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    import torch

    pip = subprocess.run([str(python), "-m", "pip", "install", "--quiet", f"torch=={torch.__version__}"],
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    before = _run(python, "import torch; print(torch.__version__)").stdout
    assert _run(python, "import course_lib").returncode != 0  # really absent

    nb = notebook.read(config.student_path(CHAPTERS[0]))
    install = nb.cells[0].source
    setup = "\n".join(nb.cells[i].source for i in notebook.setup_cells(nb)[1:])
    first = _run(python, install + "\n" + setup, COURSE_LIB_SOURCE=str(ROOT))
    assert first.returncode == 0, first.stdout + first.stderr

    after = _run(python, "import torch, course_lib; print(torch.__version__)")
    assert after.returncode == 0, after.stderr
    assert after.stdout == before, "the install cell replaced torch"
    # Installed now: a second run does nothing (a bogus source would make pip fail).
    again = _run(python, install, COURSE_LIB_SOURCE=str(tmp_path / "does-not-exist"))
    assert again.returncode == 0, again.stderr
