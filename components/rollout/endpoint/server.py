"""`Endpoint`: the loopback HTTP server an agent's OpenAI client talks to during rollout (uvicorn + Starlette, asyncio).

Each episode gets its own path, ``http://127.0.0.1:<port>/<episode>/v1``, and every request must carry the run's
token as its API key (``Authorization: Bearer <token>``): the server listens on 127.0.0.1 only, and nothing on the
machine without the token can drive the sampler. The server is uvicorn on its own thread and event loop; a request is
handed to the episode's handler, which returns a future the round's driver answers once the sampler has, so a
waiting call costs a coroutine, never a thread, and concurrent calls still meet in one sampler call (rounds.py).
Errors answer in OpenAI's shape, ``{"error": {"message", "type", "code"}}``, which an OpenAI client raises as
`openai.APIStatusError`.

What no request can do (`EndpointLimits`): its token is checked on the head, before a byte of the body is read (an
unauthenticated request's connection is closed, its body never read), and the body is read as a stream up to
``max_request_mb`` (413; uvicorn drops the rest as it arrives, buffering at most 64 KiB); a head must
arrive within ``idle_timeout_s`` of the connection opening or of its last answer (uvicorn's own keep-alive timer
starts only after an answer), a body within ``body_timeout_s``; heads are at most h11's 16 KiB and a malformed one
(``Content-Length: -1`` or ``abc``) is answered 400 by h11; past ``max_connections`` uvicorn answers 503, past
``max_requests_in_flight`` this app does. A 503 (or 429) is sent before the request is read, so the agents' clients
retry it (http_client.py).
"""

from __future__ import annotations

import hmac
import logging
import resource
import secrets
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

from .wire import BACKLOG

Handler = Callable[[str, dict], Future]
"""(route: ``chat.completions`` or ``completions``, the request's JSON body) -> a future of (HTTP status, JSON answer)."""

OPEN_FILES = 65536
"""The soft limit on open files the endpoint raises the process's to (within the hard limit): a round of N episodes
holds 2N sockets in the trainer, client and server ends, and 1,024 is a common default."""


@dataclass(frozen=True)
class EndpointLimits:
    """What one client of the endpoint may take: request size, time, connections and requests in flight."""

    max_request_mb: float = 8.0
    """Largest request body, in MiB (413 above it)."""
    max_connections: int = 4096
    """Open connections (uvicorn's ``limit_concurrency``: a request past it is answered 503 and retried)."""
    max_requests_in_flight: int = 4096
    """Requests read or waiting for the sampler (503 past it, retried by the agents' clients)."""
    idle_timeout_s: float = 60.0
    """A connection that sends no complete request head for this long after opening or after its last answer is closed."""
    body_timeout_s: float = 30.0
    """A request whose body has not all arrived this long after its head is answered 408 and its connection closed."""

    def __post_init__(self):
        if self.max_request_mb <= 0 or self.idle_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError(f"EndpointLimits: sizes and timeouts must be > 0, got {self}")
        if self.max_connections < 1 or self.max_requests_in_flight < 1:
            raise ValueError(f"EndpointLimits: max_connections and max_requests_in_flight must be >= 1, got {self}")


class Endpoint:
    """An OpenAI-compatible server on loopback, routing each episode's requests to its handler."""

    def __init__(self, model_name: str = "policy", limits: EndpointLimits | None = None):
        from .asgi import serve

        self.token = secrets.token_urlsafe(32)
        self.model_name, self.limits = model_name, limits or EndpointLimits()
        self._handlers: dict[str, Handler] = {}
        self._lock = threading.Lock()
        self.in_flight = 0  # on the server's event loop only
        _raise_open_file_limit()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(BACKLOG)
        self.port = sock.getsockname()[1]
        self._server = serve(self, sock)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, name="openai-endpoint")
        self._thread.daemon = True
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the agents' OpenAI endpoint did not start (uvicorn on 127.0.0.1)")
            time.sleep(0.005)

    def base_url(self, episode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{episode}/v1"

    def open(self, episode: str, handler: Handler) -> None:
        with self._lock:
            self._handlers[episode] = handler

    def close_episode(self, episode: str) -> None:
        with self._lock:
            self._handlers.pop(episode, None)

    def handler(self, episode: str) -> Handler | None:
        with self._lock:
            return self._handlers.get(episode)

    def authorised(self, header: str) -> bool:
        return hmac.compare_digest(header.encode(), f"Bearer {self.token}".encode())

    def models(self) -> dict:
        return {
            "object": "list",
            "data": [{"id": self.model_name, "object": "model", "created": 0, "owned_by": "lightning-rl"}],
        }

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout=5)


def _raise_open_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):  # a container may forbid it: the round is then bounded by the old limit
            logging.getLogger(__name__).debug("could not raise RLIMIT_NOFILE to %d", target)
