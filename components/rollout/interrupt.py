"""Interrupting a sampler call in flight: an episode's deadline, a cancelled round or a stopped run ends it now.

A `Rollout.generate` call runs on its caller's thread. The caller wraps it in ``interruptible(stop)``; a sampler that
loops (HFRollout: one decoding step at a time) calls ``check_interrupted()`` between steps, which raises
`SamplingInterrupted` once ``stop()`` is true. The call then ends within one step (a prefill of the whole prompt is
one step: the endpoint bounds prompts by the policy's context before sampling). A sampler that never checks simply
runs to its end, as before.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator


class _Stops(threading.local):
    stop: Callable[[], bool] | None = None  # this thread's: set by `interruptible`


_stops = _Stops()


class SamplingInterrupted(Exception):
    """The sampler call ended early: its caller asked it to (``interruptible``)."""


@contextmanager
def interruptible(stop: Callable[[], bool]) -> Iterator[None]:
    """Within the block, sampler calls on this thread end (raising `SamplingInterrupted`) once ``stop()`` is true."""
    previous = _stops.stop
    _stops.stop = stop
    try:
        yield
    finally:
        _stops.stop = previous


def check_interrupted() -> None:
    """Raise `SamplingInterrupted` when this thread's caller asked its sampler call to end (a cheap check per step)."""
    stop = _stops.stop
    if stop is not None and stop():
        raise SamplingInterrupted("the sampler call was interrupted (an episode's deadline, a cancel or a stop)")
