"""Cell limits count work (CPU seconds of the kernel's process tree), not waiting: a busy machine
stops the same cells as a quiet one; a timeout reads as a timeout, a death as a death, at once."""

from __future__ import annotations

import subprocess
import sys
import time

import nbformat

from course_tools.book import build as book
from course_tools.grading.sandboxed import work_limit
from course_tools.student import check

BUSY = "import time\nend = time.time() + {s}\nwhile time.time() < end:\n    pass"


def _notebook(path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, str(path))
    return path


def _burners(per_core: int) -> list[subprocess.Popen]:
    # each in a session of its own, as other users' jobs are (Linux shares the CPUs by session)
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(per_core * work_limit.psutil.cpu_count())]


def _stop(burners) -> None:
    for burner in burners:
        burner.kill()
        burner.wait()


def _failure(path, timeout) -> tuple[str, float]:
    start = time.monotonic()
    try:
        book.execute(path, timeout=timeout)
    except book.NotebookFailed as e:
        return str(e), time.monotonic() - start
    return "", time.monotonic() - start


def test_tree_cpu_seconds_counts_the_children_and_their_threads():
    child = subprocess.Popen([sys.executable, "-c", BUSY.format(s=1.5)])
    parent = work_limit.psutil.Process().pid
    time.sleep(1.0)
    assert work_limit.tree_cpu_seconds(parent) - work_limit.tree_cpu_seconds(child.pid) >= 0
    assert work_limit.tree_cpu_seconds(child.pid) > 0.3
    child.wait()
    assert work_limit.tree_cpu_seconds(child.pid) == 0.0  # gone


def test_a_cell_is_allowed_its_cpu_seconds_on_a_busy_machine_as_on_a_quiet_one(tmp_path):
    # 2 s of work under a 4 s limit: on a machine with three burners per core it takes several
    # times as long by the clock and still passes; 6 s of work is stopped, quiet or busy.
    ok = _notebook(tmp_path / "ok.ipynb", "x = 1", BUSY.format(s=2))
    over = _notebook(tmp_path / "over.ipynb", "x = 1", BUSY.format(s=60))
    quiet = [_failure(ok, 4), _failure(over, 4)]
    burners = _burners(3)
    try:
        busy = [_failure(ok, 4), _failure(over, 4)]
    finally:
        _stop(burners)
    for (ok_error, _), (over_error, seconds) in (quiet, busy):
        assert ok_error == ""
        assert over_error.startswith("cell 1: ran past its limit of 4 CPU seconds (after "), over_error
        assert seconds < 40 * work_limit.BACKSTOP


def test_a_waiting_cell_is_stopped_by_the_wall_clock_backstop(tmp_path):
    path = _notebook(tmp_path / "wait.ipynb", "import time\ntime.sleep(600)")
    error, seconds = _failure(path, 1)
    assert error.startswith(f"cell 0: ran past the wall-clock backstop of {work_limit.BACKSTOP} s "
                            f"({work_limit.BACKSTOP} times its limit of 1 CPU seconds)"), error
    assert seconds < work_limit.BACKSTOP + 30


def test_a_dead_kernel_is_reported_as_a_death_at_once_with_its_exit_status(tmp_path, capfd):
    path = _notebook(tmp_path / "dies.ipynb", "print(1)", "import os\nos._exit(3)", "print(2)")
    error, seconds = _failure(path, 120)
    assert error.startswith("cell 1: the kernel died (exit status 3)"), error
    assert seconds < 20  # not the cell limit
    printed = capfd.readouterr()
    assert "Traceback" not in printed.out + printed.err
    assert "without encryption" not in printed.out + printed.err  # Unix sockets, not TCP


def test_the_self_check_interrupts_a_cell_at_its_limit_and_keeps_the_kernel(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cells = [("busy", "def busy():\n    return 1\n" + BUSY.format(s=60), "assert busy() == 1"),
             ("two", "def two():\n    return 2", "assert two() == 2")]
    for name, answer, test in cells:
        nb.cells.append(nbformat.v4.new_code_cell(answer, metadata={"nbgrader": {
            "grade_id": f"ex_{name}", "solution": True, "grade": False, "locked": False}}))
        nb.cells.append(nbformat.v4.new_code_cell(test, metadata={"nbgrader": {
            "grade_id": f"ex_{name}_test", "solution": False, "grade": True, "locked": True, "points": 1}}))
    nbformat.write(nb, str(tmp_path / "nb.ipynb"))
    results = check.check(tmp_path / "nb.ipynb", timeout=3)
    assert [(r.exercise, r.status) for r in results] == [("ex_busy", "FAIL"), ("ex_two", "PASS")]
    assert results[0].detail == "your solution: the cell ran past its limit of 3 CPU seconds"
