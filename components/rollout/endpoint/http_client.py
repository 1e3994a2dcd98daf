"""The HTTP client each episode's OpenAI client is given: its own connection pool, retries of what was never served.

Why one pool per episode, on httpx2 (the HTTP library the openai package itself uses): the round's episodes used to
share one ``httpx`` client, and httpcore 1.0's pool can close a connection it has just handed to another thread's
request (encode/httpcore#1110: its surplus-idle check counts every connection, so once a round holds as many
connections as ``max_keepalive_connections`` each pass closes idle ones that a waiting request was already given;
one whose keep-alive expires in between goes the same way). The request then read a closed socket: ``httpx.ReadError:
[Errno 9] Bad file descriptor``, an ``openai.APIConnectionError`` in the agent, one or two episodes of 1,024 lost per
round with two busy processes beside the trainer. httpcore2's pool skips connections a request holds, and an
episode's own pool is used by its calls alone (one at a time, or a few at once for an async agent), so nothing
races. The clients share one SSL context (building one costs ~30 ms of CPU, far more under load; the endpoint is plain
HTTP, but every transport builds a context).

Retries (the OpenAI client's own are off: ``max_retries=0``, it would also repeat a request that timed out after the
sampler served it): a connection that failed to open is opened again (nothing was sent), and an answer 429 or 503 is
sent again after a back-off (``Retry-After`` when the server gives one), since the endpoint answers those only before
it reads a request (over ``max_connections`` or ``max_requests_in_flight``): no request is ever served twice.
"""

from __future__ import annotations

import random
import ssl
import threading
import time

import httpx2 as httpx

RETRY_STATUSES = frozenset({429, 503})
ATTEMPTS = 10
"""Sends of one request at most while the endpoint answers 429/503 (about 15 s of back-off in all)."""
CONNECT_RETRIES = 3
KEEPALIVE_S = 5.0
"""An idle connection is closed by the client after this long, well before the endpoint's ``idle_timeout_s``: the
client, not the server, ends an idle connection, so no request is sent on one the server is closing."""

_ssl_lock = threading.Lock()
_ssl_context: ssl.SSLContext | None = None


def _shared_ssl_context() -> ssl.SSLContext:
    global _ssl_context
    with _ssl_lock:
        if _ssl_context is None:
            _ssl_context = ssl.create_default_context()
        return _ssl_context


def backoff_s(attempt: int, response: httpx.Response) -> float:
    """Seconds before sending again: the server's ``Retry-After`` (capped), else 0.1 * 2^attempt with jitter, at most 2."""
    after = response.headers.get("retry-after", "")
    base = float(after) if after.replace(".", "", 1).isdigit() else 0.1 * 2**attempt
    return min(2.0, base) * random.uniform(0.5, 1.0)


class RetryOverload(httpx.BaseTransport):
    """``transport``, sending a request again when it is answered 429 or 503."""

    def __init__(self, transport: httpx.BaseTransport, attempts: int = ATTEMPTS):
        self.transport, self.attempts = transport, attempts

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()  # the body is sent again: hold it
        for attempt in range(self.attempts):
            response = self.transport.handle_request(request)
            if response.status_code not in RETRY_STATUSES or attempt == self.attempts - 1:
                return response
            response.read()
            response.close()
            time.sleep(backoff_s(attempt, response))
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.transport.close()


class AsyncRetryOverload(httpx.AsyncBaseTransport):
    """``transport``, sending a request again when it is answered 429 or 503."""

    def __init__(self, transport: httpx.AsyncBaseTransport, attempts: int = ATTEMPTS):
        self.transport, self.attempts = transport, attempts

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        import asyncio

        await request.aread()
        for attempt in range(self.attempts):
            response = await self.transport.handle_async_request(request)
            if response.status_code not in RETRY_STATUSES or attempt == self.attempts - 1:
                return response
            await response.aread()
            await response.aclose()
            await asyncio.sleep(backoff_s(attempt, response))
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self.transport.aclose()


def episode_http_client(asynchronous: bool) -> httpx.Client | httpx.AsyncClient:
    """A client for one episode: its own pool, the shared SSL context, no proxy between it and loopback."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=KEEPALIVE_S)
    context = _shared_ssl_context()
    if asynchronous:
        inner = httpx.AsyncHTTPTransport(verify=context, limits=limits, retries=CONNECT_RETRIES, trust_env=False)
        return httpx.AsyncClient(transport=AsyncRetryOverload(inner), trust_env=False)
    inner = httpx.HTTPTransport(verify=context, limits=limits, retries=CONNECT_RETRIES, trust_env=False)
    return httpx.Client(transport=RetryOverload(inner), trust_env=False)
