"""Processes in tests: which of a group's processes live, waiting for a group to end (a launched server that must
not outlive its trainer), and a child that gets Ctrl-C as from a terminal."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def group_alive(group: int) -> list[int]:
    """The pids of the live (not zombie) processes of process group ``group``."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == group and fields[0] != "Z":
            alive.append(int(entry.name))
    return alive


def gone_within(group: int, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while group_alive(group) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = group_alive(group)
    for pid in left:  # never leave one behind for the next test
        os.kill(pid, signal.SIGKILL)
    return left


def as_from_a_terminal() -> None:
    """``preexec_fn`` of a child the test sends SIGINT: Ctrl-C's default action, as a terminal gives it. A test suite
    started in the background (``&`` in a script, some CI runners) ignores SIGINT, and a child inherits an ignored
    signal: its Python then never raises KeyboardInterrupt and the test waits for nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
