"""Futures: every training and sampling call is answered at once with a request id, and its result is fetched by
``retrieve_future`` (a long poll: the answer comes when the work is done, or "try again" after ``long_poll_s``)."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from lightning_rl.service.errors import NotFound


class Answer(Protocol):
    """A finished request's result: JSON, and protobuf bytes for the result types the SDK reads as protobuf."""

    def json(self) -> dict: ...

    def proto(self) -> bytes | None: ...


@dataclass
class JSONAnswer:
    payload: dict

    def json(self) -> dict:
        return self.payload

    def proto(self) -> bytes | None:
        return None


@dataclass
class Pending:
    """One request's future: settled once, from any thread, with an `Answer` or an error; awaited on the server's
    event loop without a thread per waiting client."""

    request_id: str
    tenant: str
    session_id: str
    kind: str
    created: float = field(default_factory=time.monotonic)
    answer: Answer | None = None
    error: str | None = None
    category: str = "user"
    settled_at: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _waiters: list = field(default_factory=list, repr=False)

    @property
    def done(self) -> bool:
        return self.settled_at is not None

    def resolve(self, answer: Answer) -> None:
        self._settle(answer, None, "user")

    def fail(self, message: str, category: str = "user") -> None:
        """``category``: ``user`` (the request was wrong) or ``server`` (the service failed running it)."""
        self._settle(None, message, category)

    def _settle(self, answer: Answer | None, error: str | None, category: str) -> None:
        with self._lock:
            if self.settled_at is not None:
                return
            self.answer, self.error, self.category = answer, error, category
            self.settled_at = time.monotonic()
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            loop.call_soon_threadsafe(_wake, waiter)

    async def wait(self, timeout: float) -> bool:
        """Whether the request is done, waiting up to ``timeout`` seconds for it."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.settled_at is not None:
                return True
            waiter = loop.create_future()
            self._waiters.append((loop, waiter))
        try:
            await asyncio.wait_for(waiter, timeout)
            return True
        except asyncio.TimeoutError:
            return self.done
        finally:
            with self._lock:
                self._waiters = [w for w in self._waiters if w[1] is not waiter]


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


class FutureStore:
    """Every request's future by id, visible only to the key that made it; a result is kept ``ttl_s`` after it
    settles (the SDK may ask again after a dropped connection), then dropped."""

    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._futures: dict[str, Pending] = {}

    def create(self, tenant: str, session_id: str, kind: str) -> Pending:
        future = Pending(secrets.token_hex(16), tenant, session_id, kind)
        with self._lock:
            self._futures[future.request_id] = future
        return future

    def get(self, tenant: str, request_id: str) -> Pending:
        with self._lock:
            future = self._futures.get(request_id)
        if future is None or future.tenant != tenant:  # another key's request reads as no request at all
            raise NotFound(
                f"no request {request_id!r}: it was never made with this API key, or its result was dropped "
                f"{self.ttl_s:g} s after it finished",
                "request_id",
            )
        return future

    def expire(self, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        with self._lock:
            old = [k for k, f in self._futures.items() if f.settled_at is not None and now - f.settled_at > self.ttl_s]
            for key in old:
                del self._futures[key]
        return len(old)

    def drop_session(self, session_id: str) -> None:
        """A finished session's results go; its requests still queued were failed by the scheduler."""
        with self._lock:
            for key in [k for k, f in self._futures.items() if f.session_id == session_id and f.done]:
                del self._futures[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._futures)
