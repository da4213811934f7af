"""What a trusted process inside a sandbox does so that the code it runs cannot reach it.

**Sandboxed side**: runs inside the sandbox, beside student code; it decides no verdict.

The grading worker and the graded-run runner share their sandbox, and their user, with the
student's code. A process of the same user can read another's memory and open its descriptors
through ``/proc`` (``/proc/PID/mem``, ``/proc/PID/fd/1``: the pipe the grader reads) and can signal
it. A non-dumpable process refuses the first two to every process without ``CAP_SYS_PTRACE``,
which nothing in the sandbox has; the runner also starts as the sandbox's init (``bwrap
--as-pid-1``), which the kernel never lets a process of its own namespace kill or stop, and
ignores the signals it would otherwise act on.
"""

from __future__ import annotations

import signal
import sys

PR_SET_DUMPABLE = 4


def undumpable() -> None:
    """Make this process non-dumpable (Linux; elsewhere there is no sandbox to harden)."""
    if sys.platform.startswith("linux"):
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def deaf() -> None:
    """Ignore the signals that would stop this process from inside its sandbox (an init ignores
    SIGKILL and SIGSTOP from its namespace by itself; these would reach a handler)."""
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGPIPE", "SIGALRM"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
