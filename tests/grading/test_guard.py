"""The guarded kernel: each way an examiner forged a verdict works in the plain kernel and fails in ours.

Every cheat notebook is: an install cell, a set-up cell (imports torch and checks), an answer cell
with the cheat, and a test cell whose answer is wrong, so that it must end in an error output.
"""

from __future__ import annotations

import json
import os

import nbformat
import pytest
from nbclient import NotebookClient

from course_lib.grading import config, guard, notebook

SETUP = "import sys\nimport torch\nfrom course_lib import attention\nfrom course_lib.grading import checks"
WRONG = "checks.assert_close(torch.ones(2), torch.zeros(2), 'ones against zeros')"

# name -> (answer cell, test cell); in the plain kernel each test cell passes although it is wrong,
# except where PLAIN_ERRORS says which error the plain kernel shows instead of running the tests.
CHEATS = {
    "input transformer blanks later cells": (
        "get_ipython().input_transformers_cleanup.append(lambda lines: [])", WRONG),
    "custom exception handler swallows AssertionError": (
        "get_ipython().set_custom_exc((AssertionError,), lambda *args, **kwargs: [])", WRONG),
    "torch.testing.assert_close patched": (
        "torch.testing.assert_close = lambda *args, **kwargs: None",
        "torch.testing.assert_close(torch.ones(2), torch.zeros(2))"),
    "torch.equal patched": (
        "torch.equal = lambda *args: True", "assert torch.equal(torch.ones(2), torch.zeros(2))"),
    "checks.assert_close patched": (
        "import course_lib.grading.checks as c\nc.assert_close = lambda *args, **kwargs: None", WRONG),
    "course_lib reference patched": (
        "def causal_mask(S):\n    return 'mine'\n\nattention.causal_mask = lambda S, Sk=None: 'mine'",
        "checks.assert_equal(causal_mask(3), attention.causal_mask(3), 'causal_mask(3)')"),
    "torch.Tensor.__eq__ patched": (
        "torch.Tensor.__eq__ = lambda self, other: torch.tensor(True)",
        "assert bool((torch.ones(2) == torch.zeros(2)).all())"),
    "torch.Tensor method patched": (
        "torch.Tensor.allclose = lambda self, *args, **kwargs: True",
        "assert torch.ones(2).allclose(torch.zeros(2))"),
    "notebook's torch rebound to a fake": (
        "class _Fake:\n    def __getattr__(self, name):\n        return lambda *args, **kwargs: True\n\n"
        "torch = _Fake()", "assert torch.equal(torch.ones(2), torch.zeros(2))"),
    "builtin shadowed in the notebook": (
        "def bool(x):\n    return True", "assert bool(torch.ones(2).sum() == 5)"),
    "pre_run_cell callback raises SystemExit": (
        "def _stop(*args):\n    raise SystemExit\n\n"
        "get_ipython().events.register('pre_run_cell', _stop)", WRONG),
    "pre_run_cell callback patches again": (
        "get_ipython().events.register('pre_run_cell', lambda *a: setattr(torch, 'equal', lambda *b: True))",
        "assert torch.equal(torch.ones(2), torch.zeros(2))"),
    "trace function patches again": (
        "def _tracer(frame, event, arg):\n    torch.equal = lambda *args: True\n\nsys.settrace(_tracer)",
        "assert torch.equal(torch.ones(2), torch.zeros(2))"),
    "answer patches the checks when called": (
        "def answer():\n    import course_lib.grading.checks as c\n"
        "    c.assert_close = lambda *args, **kwargs: None\n    return torch.ones(2)",
        "_a = answer()\nchecks.assert_close(_a, torch.zeros(2), 'answer()')"),
    "kernel's do_execute shadowed": (
        "async def _skip(*args, **kwargs):\n"
        "    return {'status': 'ok', 'execution_count': 1, 'user_expressions': {}, 'payload': []}\n\n"
        "get_ipython().kernel.do_execute = _skip", WRONG),
}

PLAIN_ERRORS = {"pre_run_cell callback raises SystemExit": ["SystemExit"]}


def _notebook(answer: str, test: str) -> nbformat.NotebookNode:
    setup = nbformat.v4.new_code_cell(SETUP, metadata={"tags": [config.SETUP_TAG]})
    test_cell = nbformat.v4.new_code_cell(test, metadata={"nbgrader": {
        "grade": True, "grade_id": "ex_x_test", "locked": True, "points": 1.0, "solution": False}})
    answer_cell = nbformat.v4.new_code_cell(answer, metadata={"nbgrader": {
        "grade": False, "grade_id": "ex_x", "locked": False, "solution": True}})
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("pass"), setup, answer_cell, test_cell])


@pytest.fixture
def run(tmp_path, monkeypatch):
    """Execute a notebook in the guarded kernel (``guarded=True``) or the plain python3 kernel."""
    name = guard.install_kernelspec(tmp_path)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))

    def execute(nb, guarded: bool, path: str | None = None):
        kernel = name if guarded else "python3"
        client = NotebookClient(nb, kernel_name=kernel, allow_errors=True, timeout=120,
                                resources={"metadata": {"path": path or str(tmp_path)}})
        client.execute(env={**os.environ, **guard.environment(nb)})
        return nb

    return execute


def _errors(cell) -> list[str]:
    return [o.ename for o in cell.outputs if o.output_type == "error"]


@pytest.mark.parametrize("guarded", [False, True], ids=["plain", "guarded"])
@pytest.mark.parametrize("cheat", list(CHEATS))
def test_a_cheat_forges_the_plain_kernel_and_fails_in_the_guarded_one(run, cheat, guarded):
    nb = run(_notebook(*CHEATS[cheat]), guarded)
    assert not _errors(nb.cells[1]) and not _errors(nb.cells[2])  # set-up and cheat ran
    errors = _errors(nb.cells[3])
    if guarded:  # the tests ran (no SystemExit in their place) and found the wrong answer
        assert errors and "SystemExit" not in errors, f"{cheat}: {errors or 'the wrong answer passed'}"
    else:
        assert errors == PLAIN_ERRORS.get(cheat, []), f"{cheat}: not a cheat in the plain kernel: {errors}"


def test_a_replaced_excepthook_does_not_hide_the_error(run):
    """IPython itself sets sys.excepthook while a cell runs, so this cannot forge even the plain
    kernel; the guard puts it back as well, and the wrong answer still fails."""
    nb = run(_notebook("def swallow(*args):\n    pass\n\nsys.excepthook = swallow",
                       f"print(sys.excepthook.__name__)\n{WRONG}"), guarded=True)
    assert _errors(nb.cells[3]) == ["AssertionError"]
    assert "swallow" not in nb.cells[3].outputs[0]["text"]


def test_an_honest_notebook_passes_and_set_up_bindings_survive_in_the_guarded_kernel(run):
    nb = _notebook("def double(x):\n    return 2 * x\n\nresult = sys.getrecursionlimit()",
                   "import torch._dynamo  # wraps torch.manual_seed on import: a library's change, allowed\n"
                   "checks.assert_close(double(torch.ones(2)), torch.full((2,), 2.0), 'double(ones)')\n"
                   "print(type(torch).__name__, attention.causal_mask(2).tolist())")
    nb = run(nb, guarded=True)
    assert not any(_errors(c) for c in nb.cells)
    assert "module [[True, False], [True, True]]" in nb.cells[3].outputs[0]["text"]


def test_environment_names_the_test_and_set_up_cells_by_digest():
    nb = _notebook("x = 1", WRONG)
    env = guard.environment(nb)
    assert env[guard.TESTS_ENV] == guard.digest(WRONG)
    assert env[guard.SETUP_ENV].split(",") == [guard.digest("pass"), guard.digest(SETUP)]


def test_install_kernelspec_writes_a_kernel_json_that_starts_this_module(tmp_path):
    name = guard.install_kernelspec(tmp_path)
    spec = json.loads((tmp_path / "kernels" / name / "kernel.json").read_text())
    assert spec["argv"][1:] == ["-m", "course_lib.grading.guard", "-f", "{connection_file}"]
    assert spec["language"] == "python"


@pytest.mark.slow
def test_a_real_chapter_runs_clean_in_the_guarded_kernel(run):
    """02_attention's solution, every cell, in the guarded kernel: no error in any test cell. What the
    guard costs in time is measured by benchmarks/bench_guard.py, not asserted here."""
    path = config.solution_path("02_attention")
    nb = run(notebook.read(path), True, path=str(path.parent))
    tests = [c for c in nb.cells if c.cell_type == "code" and notebook.nbgrader_meta(c).get("grade")]
    errors = [e for c in tests for e in _errors(c)]
    assert len(tests) >= 5 and not errors, errors
