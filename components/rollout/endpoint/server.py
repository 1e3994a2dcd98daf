"""`Endpoint`: the loopback HTTP server an agent's OpenAI client talks to during rollout (uvicorn + Starlette, asyncio).

Each episode gets its own path, ``http://127.0.0.1:<port>/<episode>/v1``, and its own API key (`Endpoint.token`: the
episode's name and an HMAC of it under a secret the endpoint draws at start), which the client handed to its agent
carries (``Authorization: Bearer <key>``). The server listens on 127.0.0.1 only: nothing on the machine without a key
can drive the sampler (401, its connection closed), and an episode's key is good at its own path only (403 at
another's), so no request becomes another episode's training row. The server is uvicorn on its own thread and event loop; a request is
handed to the episode's handler, which returns a future the round's driver answers once the sampler has, so a
waiting call costs a coroutine, never a thread, and concurrent calls still meet in one sampler call (rounds.py).
Errors answer in OpenAI's shape, ``{"error": {"message", "type", "code"}}``, which an OpenAI client raises as
`openai.APIStatusError`.

What no request can do (`EndpointLimits`): its key is checked on the head, before a byte of the body is read (an
unauthenticated request's connection is closed, its body never read), and the body is read as a stream up to
``max_request_mb`` (413; uvicorn drops the rest as it arrives, buffering at most 64 KiB); a head must
arrive within ``idle_timeout_s`` of the connection opening or of its last answer (uvicorn's own keep-alive timer
starts only after an answer), a body within ``body_timeout_s``; heads are at most h11's 16 KiB and a malformed one
(``Content-Length: -1`` or ``abc``) is answered 400 by h11. Of ``max_connections`` slots, one held by a connection
that has sent no request head yet is taken back (the connection closed, oldest first) when another connection opens,
so idle connections without a key cannot lock the agents out; past it with every slot serving a request, and past
``max_requests_in_flight``, the app answers 503. A 503 (or 429) is sent before the request is read, so the agents'
clients retry it (http_client.py). Bodies held at once (read, or parsed and waiting for the sampler) are at most
``max_bytes_in_flight``: a request past it waits, its body unread, until earlier ones are answered. The request's
JSON is read by lightning_rl.core.untrusted_json (nesting and numbers bounded): no body can make the app recurse, and
any other failure on one request is a 500 for it and one line in the log.
"""

from __future__ import annotations

import base64
import hashlib
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
    """What the endpoint's clients may take: request size, time, connections, requests and bytes in flight."""

    max_request_mb: float = 8.0
    """Largest request body, in MiB (413 above it)."""
    max_connections: int = 4096
    """Open connections. One that has sent no request head yet gives its slot up (it is closed, oldest first) to a
    connection that opens past the limit; one opened while every slot serves a request is answered 503 and retried.
    Each costs a file descriptor and up to ~320 KiB of buffers (uvicorn reads a body up to 64 KiB ahead, the kernel's
    socket buffer besides)."""
    max_requests_in_flight: int = 4096
    """Requests read or waiting for the sampler (503 past it, retried by the agents' clients)."""
    max_bytes_in_flight: int = 64 * 2**20
    """Bytes of request bodies held at once, read or parsed and waiting for the sampler (64 MiB). A request past it
    waits, its body unread, until earlier ones are answered (first come, first served): a bound on memory, at the cost
    of smaller sampler batches when a round's requests are larger together. Parsed, a chat request holds about 1.6
    times its bytes (a body of tiny JSON objects up to ~25 times). At least ``max_request_mb``."""
    idle_timeout_s: float = 60.0
    """A connection that sends no complete request head for this long after opening or after its last answer is closed."""
    body_timeout_s: float = 30.0
    """A request whose body has not all arrived this long after its head is answered 408 and its connection closed."""

    def __post_init__(self):
        if self.max_request_mb <= 0 or self.idle_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError(f"EndpointLimits: sizes and timeouts must be > 0, got {self}")
        if self.max_connections < 1 or self.max_requests_in_flight < 1:
            raise ValueError(f"EndpointLimits: max_connections and max_requests_in_flight must be >= 1, got {self}")
        if self.max_bytes_in_flight < self.max_request_mb * 2**20:
            raise ValueError(
                f"EndpointLimits: max_bytes_in_flight ({self.max_bytes_in_flight}) must hold one request of "
                f"max_request_mb ({self.max_request_mb:g} MiB = {int(self.max_request_mb * 2**20)} bytes)"
            )


class Endpoint:
    """An OpenAI-compatible server on loopback, routing each episode's requests to its handler."""

    def __init__(self, model_name: str = "policy", limits: EndpointLimits | None = None):
        from .asgi import serve

        self._secret = secrets.token_bytes(32)
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

    def token(self, episode: str) -> str:
        """``episode``'s API key: its name and the HMAC-SHA256 of it under the endpoint's secret (no key is stored, and
        an ended episode's key still names it, so its late requests are told it ended)."""
        digest = hmac.new(self._secret, episode.encode(), hashlib.sha256).digest()
        return f"{episode}.{base64.urlsafe_b64encode(digest).decode().rstrip('=')}"

    def holder(self, header: str) -> str | None:
        """The episode whose key the ``Authorization`` header carries (``Bearer <key>``), or None for no key of ours."""
        scheme, _, key = header.partition(" ")
        episode = key.rpartition(".")[0]
        if scheme != "Bearer" or not episode:
            return None
        return episode if hmac.compare_digest(key.encode(), self.token(episode).encode()) else None

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
