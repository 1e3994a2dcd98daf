"""Tool functions for the benchmarks (standard library only: a FunctionTool worker imports this module)."""

from __future__ import annotations

import time


def wait_half_second(text: str) -> str:
    """A tool that waits on a remote service for 0.5 s, then answers its argument."""
    time.sleep(0.5)
    return text
