"""The course under stress: three CPU burners per core while the chapters' long cells run and a
small class is graded.

On a busy 2-core Xeon with AMX the book once failed in every build: chapter 03's second training
cell and chapter 04's first training run went past the per-cell limit, because OpenMP's threads
spun while other jobs needed the cores (training 7.6 times slower), and the limit counted wall
time. Kernels now sleep their threads (``config.kernel_env``) and limits count CPU seconds
(``work_limit``). The test process's own thread settings are removed from the environment, so the
course's settings are what is tested.

What runs (the budget file gives its cost): chapter 03 up to its last training cell and chapter 04
up to its first training runs, as the book build runs them; then a class of two of chapter 01
(the solution and a wrong answer), graded as ``make grade`` does, whose grades must be those of
a quiet run.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys

import nbformat
import pytest

from course_tools import config, notebook
from course_tools.book import build as book
from tests.conftest import ROOT
from tests.helpers import answered, mutants, write

BURNERS_PER_CORE = 3


@pytest.fixture
def burners(monkeypatch):
    for name in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(name, raising=False)
    # each in a session of its own, like other users' jobs: Linux shares the CPUs between sessions
    # first (autogroup), and a kernel, which runs in its own, would otherwise get half the machine
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
             for _ in range(BURNERS_PER_CORE * (os.cpu_count() or 1))]
    yield
    for proc in procs:
        proc.kill()
        proc.wait()


def _through(chapter: str, marker: str, which: int) -> nbformat.NotebookNode:
    """The solution of ``chapter`` up to the ``which``-th code cell that contains ``marker``."""
    nb = notebook.read(config.solution_path(chapter))
    cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and marker in c.source]
    assert cells, f"{chapter} has no cell with {marker!r}"
    nb.cells = nb.cells[:cells[which] + 1]
    return nb


@pytest.mark.slow
@pytest.mark.parametrize("chapter, marker, which", [("03_transformer", "train.train(", -1),
                                                    ("04_normalization", "train_run(", 1)])
def test_the_long_cells_run_with_three_burners_per_core(chapter, marker, which, tmp_path, capfd, burners):
    path = tmp_path / f"{chapter}.ipynb"
    nbformat.write(_through(chapter, marker, which), path)
    # in the chapter's folder, as the book runs it; raises on an error, a cell past its limit or a death
    run = book.execute(path, folder=config.solution_path(chapter).parent)
    errors = [o.ename for c in run.nb.cells if c.cell_type == "code"
              for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    printed = capfd.readouterr()
    assert "ZMQError" not in printed.err and "Traceback" not in printed.err
    cpu = max(run.cell_cpu.values())
    print(f"{chapter} through its long cells, three burners per core: {run.seconds:.0f} s, "
          f"{run.cpu_seconds:.0f} CPU seconds, the most in one cell {cpu:.0f} "
          f"(limit {config.cell_timeout()})")
    assert cpu < config.cell_timeout() / 2


@pytest.mark.slow
def test_a_class_graded_with_three_burners_per_core_gets_the_grades_of_a_quiet_run(tmp_path, burners):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    chapter = config.chapters()[0]
    target = f"{chapter}/{chapter}.ipynb"
    grading = tmp_path / "grading"
    mutant = mutants(chapter)[0]
    write(answered(chapter), grading / "submitted" / "perfect" / target)
    write(answered(chapter, mutant=mutant), grading / "submitted" / "one_wrong" / target)
    proc = subprocess.run(["make", "-o", ".venv/.installed", "grade", f"CHAPTER={chapter}",
                           f"GRADING={grading}", f"PY={sys.executable}"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with (grading / "grades" / f"{chapter}.csv").open() as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    points = {ex.name: ex.points for ex in notebook.exercises(notebook.read(config.solution_path(chapter)))}
    full = sum(points.values())
    # what a quiet run gives, by construction (tests/grading/test_nbgrader_end_to_end.py checks it quiet)
    assert float(rows["perfect"]["autograded"]) == full
    assert float(rows["one_wrong"]["autograded"]) == full - points[mutant["grade_id"]]
    assert all(float(rows["perfect"][name]) == p for name, p in points.items())
