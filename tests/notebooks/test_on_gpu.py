"""Every solution notebook runs top to bottom on a CUDA machine, unedited, within its budget.

Marked ``gpu`` and skipped, with the reason shown by ``-ra``, where torch sees no CUDA GPU. A
chapter that trains a model or asks course_lib for a device must really have used the GPU (a
cell appended to the executed copy reads ``torch.cuda.max_memory_allocated()``), so a
notebook that pins the CPU fails here.
"""

from __future__ import annotations

import time

import nbformat
import pytest
import torch
from nbclient import NotebookClient

from course_tools import config, notebook
from tests.conftest import CHAPTERS

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (run on a GPU machine)")]

PROBE = "import torch\nprint(torch.cuda.max_memory_allocated())"


def _uses_the_device(nb) -> bool:
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    return "train.train(" in code or "get_device(" in code


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_solution_runs_on_cuda_within_twice_its_budget(chapter):
    path = config.solution_path(chapter)
    nb = notebook.read(path)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    client = NotebookClient(nb, timeout=config.cell_timeout(), kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    assert seconds <= config.BUDGET_MARGIN * config.NOTEBOOK_BUDGET_S, \
        f"{chapter} took {seconds:.0f} s on the GPU"
    peak = int(nb.cells[-1].outputs[0]["text"])
    if _uses_the_device(nb):
        assert peak > 0, f"{chapter} trains a model but allocated nothing on the GPU"
