"""`deadline`: interrupt a reward call that runs past its time (SIGALRM; the main thread of a POSIX process).

Python code (loops, ``time.sleep``, I/O waits) is interrupted; a C extension that never returns to
the interpreter is not, which is why `PooledReward` also bounds the whole batch from the parent.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class DeadlineExceeded(BaseException):
    """Raised inside the timed call (a BaseException, so the reward's own ``except Exception`` cannot swallow it)."""


@contextmanager
def deadline(seconds: float | None):
    """Raise `DeadlineExceeded` in the block after ``seconds`` (None, or outside the main thread: no limit)."""
    if seconds is None or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise DeadlineExceeded(seconds)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
