"""A push of several requests with no sample ever taken from a partly updated server.

An engine loads each bucket as it arrives and may free its update lock between two requests, so around the buckets
a push (on rank 0) closes the client's `SamplingGate` (our new requests wait) and pauses every server: with partial
rollouts in asynchronous training in mode abort (the requests in flight end now and continue with the new weights),
otherwise once our requests in flight have finished. After the buckets the servers resume and the gate opens. When
the push fails, the servers stay paused (they may hold part of the push) and the gate fails every request until a
push succeeds; the next rollout pushes the whole policy again.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Protocol

from .http import HTTPClient


class Pausable(Protocol):
    """What a push pauses: an engine's servers (`Engine`) and its client's sampling gate."""

    client: HTTPClient

    def pause(self, urls: list[str], abort: bool) -> None: ...

    def resume(self, urls: list[str]) -> None: ...


@contextmanager
def paused(engine: Pausable, urls: list[str], abort: bool) -> Iterator[None]:
    gate = engine.client.gate
    gate.close()
    try:
        if abort:
            engine.pause(urls, abort=True)  # our requests in flight end with what they have
        gate.wait_idle()
        if not abort:
            engine.pause(urls, abort=False)
        yield
        engine.resume(urls)
    except BaseException as err:
        gate.open(failure=f"no sample is taken from a server that may hold part of a failed weight push ({err})")
        raise
    gate.open()
