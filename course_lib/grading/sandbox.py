"""Execute a submission for grading so that one student's notebook never breaks the class.

nbgrader's autograder is configured (``nbgrader_config.py``) to execute notebooks with
:class:`SandboxedExecute` instead of its own ``Execute``. The notebook, with the instructor's
tests already restored by nbgrader, goes to a worker process on standard input and comes back
executed on standard output, so no file holding the hidden tests is ever visible to the
student's code. The worker runs:

- on Linux with ``bwrap`` installed, in a bubblewrap sandbox: the file system read-only, a
  private /tmp, no network, the course's solutions, tests and grading folders hidden, and only
  the submission's own folder writable;
- elsewhere in a plain subprocess, with a warning;
- always under ``prlimit`` (where present) with a cap on memory, and a wall-clock limit.

Inside, every code cell runs with the course's per-cell time limit. An error or timeout is
recorded in that cell and the next cells run; if the kernel dies (``os._exit``, a crash, the
memory cap), a new kernel starts, the set-up cells run again and grading goes on from the next
cell. Output beyond ``MAX_OUTPUT_CHARS`` per cell is dropped with a note. Only an error costs a
test cell its points: warnings and other stderr output in test cells are kept as stdout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Integer, List, Unicode

from . import config, notebook

MAX_OUTPUT_CHARS = 100_000
MEMORY_LIMIT_BYTES = 6 * 2**30  # address space of the worker and the kernel, each


def bwrap_available() -> bool:
    return sys.platform.startswith("linux") and shutil.which("bwrap") is not None


def sandbox_prefix(workdir: Path, hidden: list[Path]) -> list[str]:
    """The bubblewrap command line that confines a worker to ``workdir``."""
    cmd = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    # /tmp is private; re-expose the interpreter and the course library if they live there.
    for keep in {Path(sys.prefix).resolve(), config.root()}:
        cmd += ["--ro-bind", str(keep), str(keep)]
    hidden = [str(p.resolve()) for p in hidden if p.exists()]
    for path in hidden:  # an empty folder in place of each
        cmd += ["--tmpfs", path]
    workdir = workdir.resolve()
    cmd += ["--bind", str(workdir), str(workdir), "--chdir", str(workdir)]
    for path in hidden:  # read-only once the submission's own folder is mounted inside
        cmd += ["--remount-ro", path]
    cmd += ["--setenv", "HOME", str(workdir), "--setenv", "MPLCONFIGDIR", "/tmp/matplotlib",
            "--setenv", "JUPYTER_RUNTIME_DIR", "/tmp/jupyter", "--setenv", "IPYTHONDIR", "/tmp/ipython",
            "--unshare-all", "--die-with-parent", "--new-session"]
    return cmd


def hidden_paths() -> list[Path]:
    """What a submission must not see: solutions, tests and everything under grading folders."""
    root = config.root()
    extra = [Path(p) for p in os.environ.get("COURSE_SANDBOX_HIDE", "").split(os.pathsep) if p]
    return [root / "solutions", root / "tests", root / "grading", root / ".git", *extra]


class SandboxedExecute(NbGraderPreprocessor):
    """nbgrader preprocessor: execute the notebook in a sandboxed worker process."""

    timeout = Integer(0, help="Seconds per cell; 0 means the course's execute.timeout").tag(config=True)
    memory_limit = Integer(MEMORY_LIMIT_BYTES, help="Address-space cap in bytes").tag(config=True)
    hide = List(Unicode(), help="Extra folders to hide from the submission").tag(config=True)

    def preprocess(self, nb, resources):
        workdir = Path(resources.get("metadata", {}).get("path") or os.getcwd())
        per_cell = self.timeout or config.cell_timeout()
        n_code = sum(c.cell_type == "code" for c in nb.cells)
        wall = per_cell * (n_code + 2) + 60  # every cell may use its full limit, plus restarts
        worker = [sys.executable, "-m", "course_lib.grading.sandbox", "--timeout", str(per_cell)]
        if shutil.which("prlimit"):
            worker = ["prlimit", f"--as={self.memory_limit}", "--", *worker]
        if bwrap_available():
            hidden = hidden_paths() + [Path(p) for p in self.hide]
            worker = sandbox_prefix(workdir, hidden) + worker
        else:
            warnings.warn("bubblewrap (bwrap) is not available: grading without a sandbox", stacklevel=2)
            self.log.warning("bubblewrap (bwrap) is not available: grading without a sandbox")
        try:
            proc = subprocess.run(worker, input=nbformat.writes(nb), capture_output=True, text=True,
                                  cwd=workdir, timeout=wall)
        except subprocess.TimeoutExpired:
            return _failed(nb, f"grading stopped after {wall} s"), resources
        if proc.returncode != 0 or not proc.stdout.strip():
            return _failed(nb, f"the grading worker failed: {proc.stderr[-2000:]}"), resources
        return nbformat.reads(proc.stdout, as_version=4), resources


def _failed(nb, message: str):
    """Mark every test cell as failed (no points), keeping the notebook for feedback."""
    for cell in nb.cells:
        if cell.cell_type == "code" and notebook.nbgrader_meta(cell).get("grade"):
            cell.outputs = [nbformat.v4.new_output("error", ename="GradingError", evalue=message,
                                                   traceback=[message])]
    return nb


def _size(outputs) -> int:
    return sum(len(str(o.get("text", ""))) + len(str(o.get("data", ""))) for o in outputs)


class _LimitedClient(NotebookClient):
    """A notebook client that keeps about ``MAX_OUTPUT_CHARS`` of output per cell."""

    def output(self, outs, msg, display_id, cell_index):
        if _size(outs) > MAX_OUTPUT_CHARS and msg["msg_type"] != "error":
            return None  # drop output past the limit, never errors (they decide the points)
        return super().output(outs, msg, display_id, cell_index)


def _truncate(cell) -> None:
    """Cut the text outputs of ``cell`` to the limit, with a note saying so."""
    if _size(cell.outputs) <= MAX_OUTPUT_CHARS:
        return
    budget = MAX_OUTPUT_CHARS
    for out in cell.outputs:
        if out.output_type == "stream" and budget < len(out.text):
            out.text = out.text[:max(budget, 0)]
        if out.output_type == "stream":
            budget -= len(out.text)
        elif "data" in out and _size([out]) > MAX_OUTPUT_CHARS:
            out.data = {"text/plain": "[large output removed]"}
    note = f"\n[output truncated after {MAX_OUTPUT_CHARS} characters]\n"
    cell.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=note))  # a note, not a failure


def _stderr_to_stdout(cell) -> None:
    """nbgrader gives no points for a test cell with any stderr output; a warning raised while the
    tests ran (a deprecation in a library the answer calls, say) is not a failure, so in test cells
    stderr becomes stdout. Only an error output costs points."""
    if notebook.nbgrader_meta(cell).get("grade"):
        for out in cell.outputs:
            if out.output_type == "stream" and out.name == "stderr":
                out.name = "stdout"


def execute(nb, timeout: int, path: str) -> nbformat.NotebookNode:
    """Run every code cell, surviving errors, timeouts and kernel deaths (see module doc)."""
    client = _LimitedClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            interrupt_on_timeout=True, resources={"metadata": {"path": path}})
    setup = notebook.setup_cells(nb)[1:]  # the install cell is not needed again
    pending = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    restarted = False
    while pending:
        # The kernel's own stdout must not mix with the notebook this worker prints.
        with client.setup_kernel(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
            if restarted:  # a new kernel needs the set-up cells again (outputs discarded)
                for i in setup:
                    client.execute_cell(nbformat.from_dict({**nb.cells[i], "outputs": []}), i,
                                        store_history=False)
            while pending:
                index = pending.pop(0)
                try:
                    client.execute_cell(nb.cells[index], index)
                except CellTimeoutError:
                    pass  # nbclient recorded the timeout in the cell's outputs
                except DeadKernelError:
                    nb.cells[index].outputs.append(nbformat.v4.new_output(
                        "error", ename="DeadKernelError", evalue="the kernel died in this cell",
                        traceback=["The kernel died in this cell; a new one ran the cells after it."]))
                    restarted = True
                    break
                finally:
                    _truncate(nb.cells[index])
                    _stderr_to_stdout(nb.cells[index])
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Grading worker: notebook in on stdin, out on stdout.")
    parser.add_argument("--timeout", type=int, default=None)
    args = parser.parse_args(argv)
    nb = nbformat.reads(sys.stdin.read(), as_version=4)
    nb = execute(nb, args.timeout or config.cell_timeout(), os.getcwd())
    sys.stdout.write(nbformat.writes(nb))
    return 0


if __name__ == "__main__":
    sys.exit(main())
