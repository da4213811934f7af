"""Chapter 03's training cells on a busy machine: two other processes keep both cores busy.

Under such load the training once ran past the per-cell limit and the kernel, shut down after the
timeout, died with ``ZMQError: Socket operation on non-socket``. Since then training runs in
cells that resume from a checkpoint and kernels sleep their OpenMP threads
(``config.kernel_env``); this test runs the chapter, up to its last training cell, as the book
build does (``book.execute``), with both cores taken.
"""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest

from course_lib.grading import book, config, notebook

CHAPTER = "03_transformer"


def _through_last_training_cell(path) -> nbformat.NotebookNode:
    nb = notebook.read(path)
    training = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "train.train(" in c.source]
    assert training, f"{CHAPTER} has no cell that calls train.train("
    nb.cells = nb.cells[:training[-1] + 1]
    return nb


@pytest.mark.slow
def test_training_cells_finish_within_the_cell_limit_while_both_cores_are_busy(tmp_path, capfd):
    source = config.solution_path(CHAPTER)
    path = tmp_path / f"{CHAPTER}.ipynb"
    nbformat.write(_through_last_training_cell(source), path)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        # in the chapter's folder, as the book runs it; raises on an error or a cell past the limit
        nb, seconds, _ = book.execute(path, folder=source.parent)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    slowest, index = book.slowest_cell(nb)
    errors = [o.ename for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    assert "ZMQError" not in capfd.readouterr().err
    print(f"{CHAPTER} through its training cells under load: {seconds:.0f} s, slowest cell {slowest:.1f} s "
          f"(cell {index}), limit {config.cell_timeout()} s")
    assert slowest < config.cell_timeout(), (slowest, index)
