"""A launched server never outlives the process that launched it: a watchdog process per server.

`LaunchedServer.close` stops a server's process group, and ``atexit`` calls it; but SIGKILL, an out-of-memory kill or
SIGTERM's default action end the trainer without running any of its code, and the server (a session of its own, so that
Ctrl-C in the trainer's terminal does not reach it) would go on holding its memory with parent pid 1.
``PR_SET_PDEATHSIG`` would not do: it fires when the *thread* that started the child ends, and a server may be started
from a worker thread, and it reaches only the server's first process, not the scheduler or engine core it spawns.

The watchdog is a small stdlib-only Python process, the trainer's child, that checks every ``poll_s`` whether its parent
is still the trainer. Once it is not (the trainer died: the watchdog was handed to init or a subreaper), it sends
SIGTERM to the server's whole process group, waits up to ``grace_s`` for the server's first process to go, then sends
SIGKILL to the group, and exits. It ignores SIGTERM and SIGINT (a shutdown of the trainer is not its own), and
`LaunchedServer.close` ends it with SIGKILL.
"""

from __future__ import annotations

import os
import subprocess
import sys

WATCH = """
import os, signal, sys, time
parent, group, grace, poll = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
print("ready", flush=True)
while os.getppid() == parent:
    time.sleep(poll)
def send(sig):
    try:
        os.killpg(group, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
if send(signal.SIGTERM):
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.kill(group, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    send(signal.SIGKILL)
"""


def watch(group: int, grace_s: float = 5.0, poll_s: float = 0.5) -> subprocess.Popen:
    """Start the watchdog of the process group ``group`` (the server's first process's pid: it leads a session);
    return once it runs."""
    process = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", WATCH, str(os.getpid()), str(group), str(grace_s), str(poll_s)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # Ctrl-C in the trainer's terminal reaches neither the server nor its watchdog
        close_fds=True,
    )
    process.stdout.readline()  # "ready": its signal handlers are set and it watches
    process.stdout.close()
    return process


def stop(process: subprocess.Popen) -> None:
    """End a watchdog (the server is being stopped by its owner) and reap it."""
    if process.poll() is None:
        process.kill()
    process.wait()
