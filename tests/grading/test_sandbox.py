"""The grading worker alone: sandbox confinement, its fallback, and surviving broken cells."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest

from course_lib.grading import config, sandbox
from tests.conftest import ROOT, skip_or_fail


def _notebook(*sources, setup=()):
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell("pass")]  # the install cell
    for src in setup:
        cell = nbformat.v4.new_code_cell(src)
        cell.metadata["tags"] = [config.SETUP_TAG]
        nb.cells.append(cell)
    nb.cells += [nbformat.v4.new_code_cell(s) for s in sources]
    return nb


def _texts(cell):
    return "".join(o.get("text", "") for o in cell.outputs), [o.ename for o in cell.outputs
                                                              if o.output_type == "error"]


def test_worker_survives_timeouts_kernel_death_and_huge_output(tmp_path):
    nb = _notebook("while True:\n    pass", "import os\nos._exit(3)", "print('x' * 10**7)",
                   "print(base + 1)", setup=["base = 41"])
    out = sandbox.execute(nb, timeout=3, path=str(tmp_path))
    assert "KeyboardInterrupt" in _texts(out.cells[2])[1] or "CellTimeoutError" in _texts(out.cells[2])[1]
    assert _texts(out.cells[3])[1] == ["DeadKernelError"]
    text, _ = _texts(out.cells[4])
    assert len(text) < 2 * sandbox.MAX_OUTPUT_CHARS and "output truncated" in text
    assert _texts(out.cells[5])[0] == "42\n"  # set-up re-run in the new kernel


def test_sandbox_hides_instructor_files_and_allows_only_its_folder(tmp_path):
    if not sandbox.bwrap_available():
        skip_or_fail("bubblewrap is not installed")
    work = tmp_path / "student"
    work.mkdir()
    probe = (
        "import os, pathlib\n"
        f"print(sorted(os.listdir({str(ROOT / 'solutions')!r})))\n"
        f"pathlib.Path('mine.txt').write_text('ok')\n"
        f"try:\n    pathlib.Path({str(ROOT / 'escape.txt')!r}).write_text('x')\nexcept OSError:\n"
        "    print('read-only')\n"
    )
    cmd = sandbox.sandbox_prefix(work, sandbox.hidden_paths()) + [sys.executable, "-c", probe]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[]", "read-only"]
    assert (work / "mine.txt").read_text() == "ok"
    assert not (ROOT / "escape.txt").exists()


def test_without_bubblewrap_grading_falls_back_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap_available", lambda: False)
    nb = _notebook("print(6 * 7)")
    step = sandbox.SandboxedExecute(timeout=10)
    with pytest.warns(UserWarning, match="without a sandbox"):
        out, _ = step.preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    assert _texts(out.cells[1])[0] == "42\n"


def _test_cell(source: str, grade_id: str):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": grade_id, "locked": True, "points": 2,
                                 "schema_version": 3, "solution": False, "task": False}
    return cell


def test_a_warning_in_a_test_cell_costs_no_points_and_an_error_does(tmp_path):
    """nbgrader's own verdict (determine_grade) on cells the worker executed."""
    from nbgrader.utils import determine_grade

    nb = _notebook()
    nb.cells += [
        _test_cell("import warnings\nwarnings.warn('old API', DeprecationWarning)\nassert 1 + 1 == 2", "ex_a_test"),
        _test_cell("import sys\nprint('a note', file=sys.stderr)\nprint('x' * 10**6)", "ex_b_test"),
        _test_cell("import warnings\nwarnings.warn('old API', FutureWarning)\nassert 1 == 2, 'wrong'", "ex_c_test"),
    ]
    out = sandbox.execute(nb, timeout=30, path=str(tmp_path))
    a, b, c = out.cells[1:]
    assert "old API" in _texts(a)[0] and "output truncated" in _texts(b)[0]
    assert [determine_grade(cell)[0] for cell in (a, b, c)] == [2, 2, 0]
