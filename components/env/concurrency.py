"""How many tool calls run at once by default: sized to the machine.

Tool calls mostly wait (a sandboxed program's start-up, a remote sandbox or search API, a worker process), so
several per core keep the cores busy: ``8 x cores``, at least 16 and at most 128 (each call may hold a process).
MultiTurnRollout's ``max_concurrent_tools`` and FunctionTool's ``max_workers`` default to it.
"""

from __future__ import annotations

import os


def tool_concurrency() -> int:
    """``8 x`` the cores this process may use, within [16, 128]."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(16, min(128, 8 * cores))
