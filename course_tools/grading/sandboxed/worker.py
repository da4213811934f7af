"""The sandboxed worker of :mod:`sandbox`: a notebook in on standard input, executed, out on
standard output. It imports no nbgrader (the worker starts once per submission).

**Sandboxed side**: runs inside the sandbox, beside student code; it decides no verdict.

An error or timeout is recorded in its cell and the next cells run; if the kernel dies
(``os._exit``, a crash, a limit), every process it left in the sandbox is ended, a new kernel
starts (tried three times), the set-up cells run again and grading goes on from the next cell.
Output beyond ``MAX_OUTPUT_CHARS`` per cell is dropped with a note. The cells in ``--skip``
(the tests, and the chapter's unchanged demonstrations) are not run and say so.

    python -m course_tools.grading.sandboxed.worker --timeout 60 --memory 6442450944 --processes 64 \
        --skip 4,6 [--sandboxed] < in.ipynb > out.ipynb
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time

import nbformat
from nbclient.exceptions import CellTimeoutError, DeadKernelError

from course_tools import config, notebook
from course_tools.grading.sandboxed import harden, work_limit

NOTEBOOK_S = 600  # the whole notebook's wall clock, however many cells (sandbox.Limits)
MAX_OUTPUT_CHARS = 100_000
SKIPPED = ("(not run by the grader: a demonstration of the chapter, unchanged, that no test needs; "
           "`grade --all-cells` runs it)\n")


def _size(outputs) -> int:
    return sum(len(str(o.get("text", ""))) + len(str(o.get("data", ""))) for o in outputs)


class _LimitedClient(work_limit.WatchedClient):
    """A notebook client that keeps about ``MAX_OUTPUT_CHARS`` of output per cell, and stops a cell
    at its limit of CPU seconds (its kernel is killed: a cell may ignore interrupts)."""

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


def error_output(ename: str, evalue: str):
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def _end_strays(wait_s: float = 10.0) -> None:
    """Inside the sandbox: kill every process but its init and this worker (what a dead kernel
    left behind, a fork bomb's children say) and wait until they are gone, so that the next
    kernel neither shares the process limit with them nor is killed with them by the watchdog.
    kill(-1) reaches only this pid namespace; only a sandboxed worker may call this."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())]
        if not others:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        time.sleep(0.05)  # the namespace's init reaps them


def _start_kernel(client, env: dict, sandboxed: bool, tries: int = 3) -> contextlib.ExitStack:
    """A running kernel for ``client``, to be closed by the caller. A kernel that dies while it
    starts (the watchdog still ending a submission's processes, a loaded machine) is tried again."""
    for attempt in range(tries):
        if sandboxed:
            _end_strays()
        stack = contextlib.ExitStack()
        try:
            # The kernel's own stdout must not mix with the notebook this worker prints.
            stack.enter_context(client.setup_kernel(stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.DEVNULL, env=env))
            return stack
        except RuntimeError:  # "Kernel died before replying to kernel_info"
            if attempt == tries - 1:
                raise
            time.sleep(1 + attempt)
    raise ValueError(f"tries must be at least 1, not {tries}")


def execute(nb, timeout: int, path: str, notebook_s: int = NOTEBOOK_S,
            kernel_name: str = "python3", kernel_env: dict | None = None,
            sandboxed: bool = False, skip: frozenset[int] = frozenset()) -> nbformat.NotebookNode:
    """Run every code cell but those in ``skip`` (marked as not run), surviving errors, timeouts
    and kernel deaths (see module doc)."""
    deadline = time.monotonic() + notebook_s
    # interrupt_on_timeout stays off: a cell that ignores SIGINT would never return. At its limit
    # of CPU seconds, or at the wall-clock backstop, the kernel is ended and a new one goes on.
    client = _LimitedClient(nb, timeout, kernel_name=kernel_name, allow_errors=True,
                            shutdown_kernel="immediate", resources={"metadata": {"path": path}})
    setup = notebook.setup_cells(nb)[1:]  # the install cell is not needed again
    pending = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and i not in skip]
    for i in skip:
        nb.cells[i].outputs = [nbformat.v4.new_output("stream", name="stdout", text=SKIPPED)]
    restarted = False
    while pending:
        try:
            kernel = _start_kernel(client, config.kernel_env(kernel_env), sandboxed)
        except RuntimeError as e:
            for index in pending:
                nb.cells[index].outputs = [error_output("KernelStartError", (
                    f"not run: no kernel could start, three times ({e})"))]
            return nb
        with kernel:
            if restarted:  # a new kernel needs the set-up cells again (outputs discarded)
                for i in setup:
                    client.execute_cell(nbformat.from_dict({**nb.cells[i], "outputs": []}), i,
                                        store_history=False)
            while pending:
                left = deadline - time.monotonic()
                if left < 1:
                    for index in pending:
                        nb.cells[index].outputs = [error_output("NotebookTimeLimit", (
                            f"not run: the notebook's time limit of {notebook_s} s was reached"))]
                    return nb
                index = pending.pop(0)
                client.timeout = int(min(timeout * work_limit.BACKSTOP, left))
                try:
                    client.execute_cell(nb.cells[index], index)
                except CellTimeoutError:
                    nb.cells[index].outputs.append(error_output("CellTimeoutError", (
                        f"the cell ran past the wall-clock limit of {client.timeout} s and was stopped; "
                        "a new kernel ran the cells after it")))
                    restarted = True
                    break
                except DeadKernelError:
                    if client.stopped:  # the work limit killed it
                        nb.cells[index].outputs.append(error_output("CellTimeoutError", (
                            f"the cell {client.stopped} and was stopped; "
                            "a new kernel ran the cells after it")))
                        restarted = True
                        break
                    how = " (killed)" if _exit_code(client) == -9 else ""
                    nb.cells[index].outputs.append(error_output("DeadKernelError", (
                        f"the kernel died in this cell{how}; a new one ran the cells after it")))
                    restarted = True
                    break
                finally:
                    _truncate(nb.cells[index])
    return nb


def _exit_code(client) -> int | None:
    """The dead kernel's exit status (negative: the signal that killed it), if known."""
    try:
        return client.km.provisioner.process.poll()
    except AttributeError:
        return None


def _confine_self(memory: int, processes: int) -> None:
    """Limits every process started from here inherits, and no access to this one's memory or
    pipes from the kernel (a non-dumpable process cannot be traced or read through /proc)."""
    import resource

    # Address space per process, a backstop behind the watchdog's total: torch alone maps ~1 GB.
    limits = [("RLIMIT_AS", memory + 4 * 2**30), ("RLIMIT_CORE", 0)]
    limits += [("RLIMIT_NPROC", processes)] * (processes > 0)
    for limit, value in limits:
        try:  # RLIMIT_NPROC is not enforced for the host's root; the watchdog counts as well
            resource.setrlimit(getattr(resource, limit), (value, value))
        except (AttributeError, ValueError, OSError):
            pass
    harden.undumpable()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Grading worker: notebook in on stdin, out on stdout.")
    parser.add_argument("--timeout", type=int, default=None)
    parser.add_argument("--notebook-timeout", type=int, default=NOTEBOOK_S)
    # sandbox.Limits, set by the grader: bytes per process beyond which it fails (RLIMIT_AS, with
    # room for torch's mappings), and processes (RLIMIT_NPROC, 0: none)
    parser.add_argument("--memory", type=int, required=True)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--sandboxed", action="store_true", help="this worker runs in bubblewrap")
    parser.add_argument("--skip", default="", help="indices of code cells not to run, comma-separated")
    args = parser.parse_args(argv)
    _confine_self(args.memory, args.processes)
    nb = nbformat.reads(sys.stdin.read(), as_version=4)
    nb = execute(nb, args.timeout or config.cell_timeout(), os.getcwd(), args.notebook_timeout,
                 sandboxed=args.sandboxed, skip=frozenset(int(i) for i in args.skip.split(",") if i))
    sys.stdout.write(nbformat.writes(nb))
    return 0


if __name__ == "__main__":
    sys.exit(main())
