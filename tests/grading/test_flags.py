"""flags: each suspicious pattern is reported on a tiny notebook, and the real answers give none."""

from __future__ import annotations

import nbformat
import pytest

from course_tools import config, notebook
from course_tools.grading.grader import flags
from tests.conftest import CHAPTERS
from tests.helpers import answered

SETUP = "import torch\nimport torch.nn.functional as F\nimport numpy as np\nfrom course_lib import attention"


def _notebook(answer: str, grade_id: str = "ex_causal_mask") -> nbformat.NotebookNode:
    setup = nbformat.v4.new_code_cell(SETUP, metadata={"tags": [config.SETUP_TAG]})
    cell = nbformat.v4.new_code_cell(answer, metadata={"nbgrader": {
        "grade": False, "grade_id": grade_id, "locked": False, "solution": True}})
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("pass"), setup, cell])


# answer cell -> a piece of the one flag it must raise
PATTERNS = {
    "ip = get_ipython()": "get_ipython",
    "import gc\ngc.collect()": "imports gc",
    "import ctypes": "imports ctypes",
    "import threading": "threads",
    "x = __import__('ctypes')": "imports ctypes",
    "import sys\nf = sys._getframe()": "frames",
    "def f(frame):\n    return frame.f_back": "frames",
    "def f(frame):\n    return frame.f_globals": "frames",
    "def f(frame):\n    return frame.f_locals": "frames",
    "def f(g):\n    return g.__closure__": "closures",
    "def f(g):\n    return g.__code__": "code objects",
    "def f(g):\n    return g.__globals__": "function globals",
    "b = __builtins__": "the builtins",
    "import sys\nsys.addaudithook(print)": "audit hook",
    "import sys\nsys.settrace(None)": "trace function",
    "import sys\nsys.setprofile(None)": "profile function",
    "ip.set_custom_exc((AssertionError,), None)": "custom exception handler",
    "ip.input_transformers_cleanup.append(None)": "input transformers",
    "ip.ast_transformers.append(None)": "AST transformers",
    "ip.events.register('pre_run_cell', print)": "event callback",
    "class T:\n    @classmethod\n    def __torch_function__(cls, *a):\n        pass": "__torch_function__",
    "torch.equal = lambda *a: True": "assigns torch.equal",
    "F.softmax = None": "assigns F.softmax",
    "np.allclose = None": "assigns np.allclose",
    "import math\nmath.pi = 3": "assigns math.pi",
    "import builtins\nbuiltins.len = None": "assigns builtins.len",
    "torch.Tensor.__eq__ = None": "assigns torch.Tensor.__eq__",
    "import torch.testing as tt\ntt.assert_close = None": "assigns tt.assert_close",
    "from course_tools.student import checks\nchecks.assert_close = None": "assigns checks.assert_close",
    "setattr(torch, 'equal', None)": "setattr on torch",
    "del torch.equal": "deletes torch.equal",
    "vars(attention)['causal_mask'] = None": "assigns",
    "def causal_mask(S):\n  return (": flags.NOT_PARSED,
}


@pytest.mark.parametrize("answer", list(PATTERNS))
def test_each_pattern_is_flagged_with_its_cell(answer):
    found = flags.flags(_notebook(answer))
    assert found and all(f.startswith("ex_causal_mask: ") for f in found), found
    assert any(PATTERNS[answer] in f for f in found), found


def test_plain_answers_and_other_exercises_references_are_not_flagged():
    honest = ("def causal_mask(S, Sk=None):\n    Sk = S if Sk is None else Sk\n"
              "    w = F.softmax(torch.zeros(S, Sk), dim=-1)\n"
              "    out = attention.scaled_dot_product_attention\n"
              "    x = torch.ones(2)\n    x.grad = None\n"
              "    return torch.ones(S, Sk, dtype=torch.bool).tril(Sk - S)")
    assert flags.flags(_notebook(honest)) == []


@pytest.mark.parametrize("honest", [
    "import inspect\ndef causal_mask(S):\n    return torch.ones(S, S).triu(1).bool()",  # an import alone
    "def causal_mask(S):\n    data = b'x'\n    data.decode()\n    return torch.ones(S, S).triu(1).bool()",
    "def causal_mask(S):\n    return attention.causal_mask(S)",  # what ran decides: the graded run's guard
])
def test_what_reading_cannot_decide_is_not_flagged(honest):
    """A local named like a course_lib module, an import alone, or a call the graded run observes by
    identity (course_tools.grading.sandboxed.guard) is no flag of the reading."""
    assert flags.flags(_notebook(honest)) == []


def test_cells_changed_from_the_release_are_read_and_unchanged_ones_are_not():
    release = _notebook("raise NotImplementedError()")
    nb = _notebook("raise NotImplementedError()")
    nb.cells[1].source += "\ntorch.equal = None"  # the student edited the set-up cell
    nb.cells.append(nbformat.v4.new_code_cell("get_ipython()"))  # and added a cell
    assert flags.flags(nb, release) == ["cell 1: assigns torch.equal (library code)",
                                        "cell 3: uses get_ipython"]
    assert flags.flags(release, release) == []


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_solutions_answers_give_no_flag(chapter):
    assert flags.flags(notebook.read(config.solution_path(chapter))) == []
    release = notebook.read(config.student_path(chapter))
    assert flags.flags(answered(chapter), release) == []


def test_a_cell_with_magics_is_read_as_ipython_runs_it():
    assert flags.flags(_notebook("def causal_mask(S):\n    return torch.ones(S, S).triu(1).bool()\n"
                                 "%timeit causal_mask(4)")) == []
    assert flags.flags(_notebook("%time x = 1\nimport ctypes")) == ["ex_causal_mask: imports ctypes (ctypes)"]
