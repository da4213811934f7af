"""Runs nbgrader's command line against a course folder.

The repository is the course root (``nbgrader_config.py``): ``solutions/`` is nbgrader's source
folder and ``notebooks/`` its release folder. Everything an instructor collects and grades lives
under a grading folder (``grading/`` by default, ignored by git), so tests can use a temporary one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from . import config


def course_args(grading_dir: Path | None = None, release_dir: Path | None = None,
                submitted_dir: Path | None = None) -> list[str]:
    g = Path(grading_dir or config.root() / "grading").resolve()
    submitted = Path(submitted_dir or g / "submitted").resolve()
    args = [
        f"--CourseDirectory.root={config.root()}",
        "--CourseDirectory.source_directory=solutions",
        f"--CourseDirectory.submitted_directory={submitted}",
        f"--CourseDirectory.autograded_directory={g / 'autograded'}",
        f"--CourseDirectory.feedback_directory={g / 'feedback'}",
        f"--CourseDirectory.db_url=sqlite:///{g / 'gradebook.db'}",
        f"--ExecutePreprocessor.timeout={config.cell_timeout()}",
        f"--SandboxedExecute.timeout={config.cell_timeout()}",
    ]
    if release_dir is not None:
        args.append(f"--CourseDirectory.release_directory={Path(release_dir).resolve()}")
    return args


def run(step: str, chapter: str, *extra: str, grading_dir=None, release_dir=None,
        submitted_dir=None) -> None:
    """``nbgrader STEP CHAPTER ...`` with the course's folders; raises if nbgrader fails."""
    g = Path(grading_dir or config.root() / "grading")
    g.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "nbgrader", step, chapter,
           *course_args(g, release_dir, submitted_dir), *extra]
    # nbgrader calls the `alembic` script by name: put this interpreter's scripts on PATH.
    scripts = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=os.pathsep.join([scripts, os.environ.get("PATH", "")]))
    proc = subprocess.run(cmd, cwd=config.root(), capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"nbgrader {step} {chapter} failed:\n{proc.stdout}\n{proc.stderr}")
