"""`SamplingGate`: no sample is taken from a server while a push of several requests is half done, or after one failed."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


class SamplingGate:
    """Generation requests pass while no weight push runs. A push of several requests (buckets) closes the gate: it
    waits for the requests in flight and holds new ones back until it is done, because an engine may release its
    update lock between two requests and would let a request sample from a partly updated model. After a failed push
    every request fails at once until a push succeeds: a server holding part of a push is never sampled."""

    error: type[Exception] = RuntimeError
    """What a request raises after a failed push (the engine's error class)."""

    def __init__(self, error: type[Exception] | None = None) -> None:
        if error is not None:
            self.error = error
        self._cond = threading.Condition()
        self._active = 0
        self._closed = False
        self._failure: str | None = None

    @contextmanager
    def sampling(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._closed or self._failure is not None)
            if self._failure is not None:
                raise self.error(self._failure)
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def close(self) -> None:
        """New requests wait from now on (requests in flight go on)."""
        with self._cond:
            self._closed = True

    def wait_idle(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._active == 0)

    def open(self, failure: str | None = None) -> None:
        """The push is over: requests pass again, or (``failure``) fail with this message until the next push opens it."""
        with self._cond:
            self._closed, self._failure = False, failure
            self._cond.notify_all()
