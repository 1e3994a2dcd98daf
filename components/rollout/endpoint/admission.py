"""What the endpoint admits at once: connections (`Slots`, ``max_connections``) and bytes of request bodies
(`BytesInFlight`, ``max_bytes_in_flight``), both on the endpoint's event loop (asgi.py); the limits are `EndpointLimits`
(server.py)."""

from __future__ import annotations

import asyncio
import collections

from uvicorn.protocols.http.h11_impl import H11Protocol


class Slots:
    """``max_connections`` slots for open connections. A connection that has sent no request head yet (idle since it
    opened, or sending its head a byte at a time) holds its slot only until another connection needs one: then the
    oldest such connection is closed. A connection that has sent a head keeps its slot (an unauthenticated one is
    answered 401 and closed at once), so idle connections without a key cannot lock the agents out; a
    connection opened while every slot is held by one that sent a head is answered 503 (retried)."""

    def __init__(self, max_connections: int):
        self.max_connections = max_connections
        self.waiting: dict[H11Protocol, None] = {}  # no request head yet, oldest first

    def opened(self, connection: H11Protocol) -> bool:
        """Whether ``connection`` (just opened, in ``connection.connections``) has a slot."""
        self.waiting[connection] = None
        while len(connection.connections) > self.max_connections and len(self.waiting) > 1:
            oldest = next(iter(self.waiting))  # never ``connection``: the newest
            del self.waiting[oldest]
            connection.connections.discard(oldest)  # uvicorn's count drops now, not when the close completes
            oldest.transport.close()
        return len(connection.connections) <= self.max_connections

    def stop_waiting(self, connection: H11Protocol) -> None:
        """``connection`` sent a request head (it keeps its slot until it closes), or closed."""
        self.waiting.pop(connection, None)


class BytesInFlight:
    """``max_bytes_in_flight``: bytes of request bodies held (read, or parsed and waiting for the sampler). A request
    takes its share before its body is read (its Content-Length, or ``max_request_mb`` for a chunked body, the excess
    given back once read) and gives it back when answered; one that would pass the bound waits, first come first
    served, with its body unread (uvicorn buffers at most 64 KiB of it), and is then read and served as usual."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.held = max_bytes, 0
        self._waiting: collections.deque[tuple[int, asyncio.Future]] = collections.deque()

    async def take(self, n: int) -> None:
        if not self._waiting and self.held + n <= self.max_bytes:
            self.held += n
            return
        turn = asyncio.get_running_loop().create_future()
        self._waiting.append((n, turn))
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # granted as it was cancelled
                self.give(n)
            else:
                self._waiting.remove((n, turn))
            raise

    def give(self, n: int) -> None:
        self.held -= n
        while self._waiting and self.held + self._waiting[0][0] <= self.max_bytes:
            n_next, turn = self._waiting.popleft()
            self.held += n_next
            turn.set_result(None)
