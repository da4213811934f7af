"""The watchdog of :mod:`sandbox`: limits on a whole process tree, enforced from outside it.

**Grader side**: runs in the grader's own process, never beside student code.

It reads ``/proc`` (Linux): the tree's processes in order of start, their memory (proportional
set size, with the resident size as a cheap bound), the files they hold open that no file system
counts (deleted files, memfd), what the sandbox's tmpfs hold, and their CPU time.
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
import threading
from pathlib import Path


class Watchdog(threading.Thread):
    """Enforces :class:`Limits` on the process tree under ``pid`` from outside the sandbox.

    When a limit is passed it kills every process of the tree except the first ``keep`` ones
    in start order (bubblewrap, the namespace's init and the worker), so the worker survives,
    sees a dead kernel and goes on; ``reasons`` says why, in order. Memory is what the processes
    use (:func:`_memory`), the contents of ``tmpfs``, the sandbox's own file systems (all of
    :data:`TMPFS`), and the deleted files they hold open (:func:`_held_files`). A file both
    mapped and counted as a file counts twice: stricter, never looser."""

    interval_s = 0.05

    def __init__(self, pid: int, limits, keep: int, tmpfs: tuple[str, ...] = (), bound: tuple[str, ...] = ()):
        super().__init__(daemon=True)
        self.pid, self.limits, self.keep, self.tmpfs, self.bound = pid, limits, keep, tmpfs, bound
        self.reasons: list[str] = []  # one per episode over a limit, not one per check
        self.spared: set[int] = set()  # the first ``keep`` processes, fixed once seen
        self.cpu: dict[int, float] = {}  # CPU seconds last seen per process, dead ones included
        self.done = threading.Event()

    def run(self):
        over = False
        while not self.done.wait(self.interval_s):
            tree = _tree(self.pid)
            if len(self.spared) < self.keep:
                self.spared = set(tree[:self.keep])
            reason = tree and self._over(tree)
            if reason and not over:
                self.reasons.append(reason)
            over = bool(reason)
            if reason:
                for pid in tree:
                    if pid not in self.spared:
                        _kill(pid)

    def _over(self, tree: list[int]) -> str | None:
        lim = self.limits
        if len(tree) > lim.processes:
            return f"it started more than {lim.processes} processes"
        files = _tmpfs_used(tree, self.tmpfs) + _held_files(tree, self.tmpfs, self.bound)
        # The resident size bounds the proportional one from above (a kernel's counters may lag it
        # by some pages: RESIDENT_SLACK), so the costlier count is made only near the limit.
        near = sum(_resident(pid) for pid in tree) + files > lim.memory_bytes - RESIDENT_SLACK
        if near and sum(_memory(pid) for pid in tree) + files > lim.memory_bytes:
            return (f"it used more than {lim.memory_bytes / 2**30:g} GiB of memory "
                    "(processes and files together)")
        for pid in tree:
            self.cpu[pid] = max(self.cpu.get(pid, 0.0), _cpu_seconds(pid))
        if sum(self.cpu.values()) > lim.cpu_s:
            return f"it used more than {lim.cpu_s} s of CPU time"
        return None


def _tree(root: int) -> list[int]:
    """``root`` and its descendants, in order of start (a parent before a child of its tick)."""
    started: dict[int, int] = {}
    if _children_listed():  # each thread's own list: a few reads, however busy the machine
        todo = [root]
        while todo:
            pid = todo.pop()
            if pid in started or (fields := _stat(pid)) is None:
                continue  # seen, or gone meanwhile
            started[pid] = int(fields[19])
            with contextlib.suppress(OSError):
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with contextlib.suppress(OSError):
                        todo += map(int, Path(f"/proc/{pid}/task/{tid}/children").read_text().split())
        return sorted(started, key=started.__getitem__)
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
            started[int(entry)] = int(fields[19])
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in started:
            out.append(pid)
            todo += children.get(pid, [])
    return sorted(out, key=started.__getitem__)


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (the parent is [1]), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


@functools.cache
def _children_listed() -> bool:
    """Whether this kernel lists each thread's children (``CONFIG_PROC_CHILDREN``)."""
    return os.path.exists(f"/proc/self/task/{os.getpid()}/children")


RESIDENT_SLACK = 256 * 2**20


def _memory(pid: int) -> int:
    """Proportional set size (shared pages split among their users), else resident size."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return _resident(pid)


def _resident(pid: int) -> int:
    """Resident set size, shared pages whole: cheap to read, and never below :func:`_memory`."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def _tmpfs_used(tree: list[int], places) -> int:
    """Bytes used in the file systems ``places`` as the newest living process of ``tree`` sees
    them; none while that process is in this one's mount namespace (bubblewrap before it made the
    sandbox, or no sandbox), where they would be the host's own ``/tmp``."""
    own = os.readlink("/proc/self/ns/mnt")
    for pid in reversed(tree):  # a process that just ended cannot hide the files
        try:
            if os.readlink(f"/proc/{pid}/ns/mnt") == own:
                return 0
        except OSError:
            continue  # gone meanwhile
        used = 0
        for place in places:
            with contextlib.suppress(OSError):
                st = os.statvfs(f"/proc/{pid}/root{place}")
                used += (st.f_blocks - st.f_bfree) * st.f_frsize
        return used
    return 0


DELETED = " (deleted)"  # how /proc names an open file without a name, memfd files included


def _held_files(tree: list[int], counted, bound=()) -> int:
    """Bytes of the deleted files that the processes ``tree`` hold open, memfd files included:
    memory while open, yet in no process's PSS unless mapped and on no file system's count. Each
    file counts once, by its pages in use; not those on the tmpfs ``counted`` (``_tmpfs_used``
    sees them) or on a read-only bind (the host's files, deleted by the host). A file not deleted
    lies on one of the sandbox's tmpfs, each counted or size-limited."""
    skipped = (*counted, *bound)
    seen, total = set(), 0
    for pid in tree:
        fds = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fds)
        except OSError:
            continue  # gone meanwhile
        for fd in names:
            try:
                target = os.readlink(f"{fds}/{fd}")  # "/memfd:x (deleted)", "socket:[12]", "/tmp/y"
                if not target.endswith(DELETED) or _under(target.removesuffix(DELETED), skipped):
                    continue
                st = os.stat(f"{fds}/{fd}")  # the open file itself
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512  # a sparse file's holes hold no memory
    return total


def _under(path: str, places) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in places)


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(f) for f in fields[11:13]) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (OSError, IndexError, ValueError):
        return 0.0


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except OSError:
        pass
