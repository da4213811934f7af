"""Cell limits that count work, not waiting: the CPU time of a kernel's whole process tree.

**Sandboxed side**: runs inside the sandbox, beside student code; it decides no verdict.

On a machine shared with other jobs (a student's laptop in a video call, a JupyterHub, a CI
runner) a cell's wall time grows with the load; the CPU time its kernel spends does not. So a
cell may use ``limit`` CPU seconds of the kernel and everything it started: the same work costs
about the same CPU time on one core or on several, on a quiet or on a four times oversubscribed
machine, so the same cell passes or is stopped everywhere. A wall clock
``BACKSTOP`` times longer stops a cell that waits without working (a sleep, a deadlock, or a
machine busier than that).

:class:`CellWatch` watches a running kernel from a thread of the caller and, when a cell passes
its limit, stops it: an interrupt first where the caller wants the kernel kept (the self-check),
then a kill of the whole tree. The caller learns why from :attr:`CellWatch.stopped`, and says so
as a timeout, with the cell, its time and the limit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time

import psutil
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError
from nbclient.util import run_sync

# The wall clock a cell may take, in units of its limit of CPU seconds: a cell that used all its
# CPU seconds on one core of a four times oversubscribed machine took about four times as long.
BACKSTOP = 5


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) of process ``pid`` and its living descendants, with the
    children each has waited for; 0 for a process that is gone."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            total += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
    return total


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants, children first."""
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.Error:
        return
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()


class CellWatch(threading.Thread):
    """Stops a cell of the kernel ``pid`` once its process tree used ``limit_s`` CPU seconds.

    Call :meth:`cell` around each cell; :attr:`stopped` then says why the cell was stopped (or is
    None), and :attr:`cpu_s` holds each cell's CPU seconds by index. With ``interrupt`` the kernel
    gets SIGINT first and is killed only if the cell is still running ``grace_s`` later."""

    interval_s = 0.2

    def __init__(self, pid: int, limit_s: float, interrupt: bool = False, grace_s: float = 5.0):
        super().__init__(daemon=True)
        self.pid, self.limit_s = pid, limit_s
        self.interrupt, self.grace_s = interrupt, grace_s
        self.cpu_s: dict[int, float] = {}
        self.stopped: str | None = None
        self._index: int | None = None
        self._start_cpu = 0.0
        self._seen = 0.0  # the most CPU seconds seen: a child reaped late must not count twice
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.start()

    def _total(self) -> float:
        self._seen = max(self._seen, tree_cpu_seconds(self.pid))
        return self._seen

    @contextlib.contextmanager
    def cell(self, index: int):
        with self._lock:
            self._index, self._start_cpu, self.stopped = index, self._total(), None
        try:
            yield
        finally:
            with self._lock:
                self.cpu_s[index] = self._total() - self._start_cpu
                self._index = None

    def run(self) -> None:
        fired_at = None
        while not self._done.wait(self.interval_s):
            with self._lock:
                if self._index is None:
                    fired_at = None
                    continue
                used = self._total() - self._start_cpu
                if fired_at is None and used > self.limit_s:
                    self.stopped = f"ran past its limit of {self.limit_s:g} CPU seconds"
                    fired_at = time.monotonic()
                    if self.interrupt:
                        with contextlib.suppress(OSError):
                            os.kill(self.pid, signal.SIGINT)
                    else:
                        kill_tree(self.pid)
                elif fired_at is not None and self.interrupt and time.monotonic() - fired_at > self.grace_s:
                    kill_tree(self.pid)  # it ignored the interrupt
                    fired_at = float("inf")

    def close(self) -> None:
        self._done.set()
        self.join(timeout=2)


class WatchedClient(NotebookClient):
    """An nbclient client whose cells are stopped by work, not by wall time.

    ``work_limit`` CPU seconds per cell (:class:`CellWatch`); nbclient's own ``timeout`` becomes
    the wall-clock backstop, ``BACKSTOP`` times longer. With ``interrupt_on_limit`` a cell over its
    limit is interrupted (the kernel and its state live on), else its kernel is killed.
    After a cell, :attr:`stopped` says why it was stopped by the limit (None: it was not);
    :attr:`cpu_s` holds each cell's CPU seconds by index."""

    def __init__(self, nb, work_limit: float, interrupt_on_limit: bool = False, **kw):
        super().__init__(nb, timeout=int(work_limit * BACKSTOP), **kw)
        self.work_limit, self.interrupt_on_limit = work_limit, interrupt_on_limit
        self.watch: CellWatch | None = None
        self.stopped: str | None = None
        self.cpu_s: dict[int, float] = {}
        self.exit_code: int | None = None  # of a kernel that died in a cell (negative: a signal)
        self._sockets: str | None = None  # the folder of the kernel's Unix sockets

    def kernel_pid(self) -> int | None:
        """The process id of the (local) kernel, else None."""
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            return int(self.km.provisioner.pid)
        return None

    async def async_execute_cell(self, cell, cell_index, *args, **kw):
        self.stopped = None
        pid = self.kernel_pid()
        if cell.cell_type != "code" or pid is None:
            return await super().async_execute_cell(cell, cell_index, *args, **kw)
        if self.watch is None or self.watch.pid != pid:  # the first cell, or a new kernel
            if self.watch is not None:
                self.watch.close()
            self.watch = CellWatch(pid, self.work_limit, interrupt=self.interrupt_on_limit)
        try:
            with self.watch.cell(cell_index):
                return await super().async_execute_cell(cell, cell_index, *args, **kw)
        except DeadKernelError:
            with contextlib.suppress(AttributeError):  # read now: the clean-up forgets the process
                self.exit_code = self.km.provisioner.process.poll()
            raise
        finally:
            self.stopped = self.watch.stopped
            self.cpu_s[cell_index] = self.watch.cpu_s.get(cell_index, 0.0)

    execute_cell = run_sync(async_execute_cell)  # nbclient's wraps its own coroutine, not this one

    def create_kernel_manager(self):
        """The kernel's messages go over Unix sockets where there are some (not TCP on localhost,
        which ipykernel warns about at every start), in a folder of their own."""
        km = super().create_kernel_manager()
        if os.name == "posix":
            self._sockets = tempfile.mkdtemp(prefix="kernel-")
            km.transport, km.ip = "ipc", os.path.join(self._sockets, "ipc")
        return km

    def past_backstop(self) -> str:
        """What to say of a cell stopped by the wall clock (nbclient's timeout)."""
        return (f"ran past the wall-clock backstop of {self.timeout} s ({BACKSTOP} times its limit of "
                f"{self.work_limit} CPU seconds)")

    def death(self, log: str = "") -> str:
        """Why the kernel died, in words: its exit status or signal, and the last line of its
        ``log`` (its standard error) if that says anything."""
        code = self.exit_code
        how = ("no exit status" if code is None else f"killed by signal {-code}" if code < 0
               else f"exit status {code}")
        last = log.strip().splitlines()[-1:]
        return f"{how}: {last[0][:200]}" if last else how

    async def _async_cleanup_kernel(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None
        try:
            await super()._async_cleanup_kernel()
        finally:
            if self._sockets:
                shutil.rmtree(self._sockets, ignore_errors=True)
