"""The endpoint's HTTP side: a Starlette request handler on uvicorn's HTTP/1.1 (h11) protocol, with the limits of
`EndpointLimits` (server.py) enforced in the order that keeps a hostile or broken client cheap: the token on the
head, the route and the episode, the requests in flight, then the body as a stream up to its size and time limit."""

from __future__ import annotations

import asyncio
import math
import socket

import uvicorn
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from .wire import BACKLOG, ROUTES, error, parse_json, split_path

CLOSE = {"connection": "close"}
"""On an answer to a client that is not the run's (or has stalled): closed with its body unread. A refusal to the
run's own client keeps the connection: uvicorn reads and drops the rest of the body (the head timer still bounds it),
so the client reads its answer rather than a reset."""


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request head: uvicorn's keep-alive timer starts only after an
    answer, so a connection that never sends a request, or sends its head a byte at a time, would be held forever."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._await_head(None)

    def on_response_complete(self) -> None:
        finished = self.cycle  # read before uvicorn starts a pipelined request's cycle
        super().on_response_complete()
        self._await_head(finished)

    def _await_head(self, cycle) -> None:
        self.loop.call_later(self.timeout_keep_alive, self._no_head_yet, cycle)

    def _no_head_yet(self, cycle) -> None:
        if self.cycle is cycle and not self.transport.is_closing():
            self.transport.close()


def serve(endpoint, sock: socket.socket) -> uvicorn.Server:
    """A uvicorn server of ``endpoint`` (an `Endpoint` of server.py, which imports this module when it starts) on the listening ``sock`` (not started: ``.run(sockets=[sock])``)."""
    limits = endpoint.limits
    app = _App(endpoint)
    config = uvicorn.Config(
        app,
        http=HeadDeadlineProtocol,
        loop="asyncio",
        interface="asgi3",
        lifespan="off",
        ws="none",
        log_config=None,  # the trainer's logging stays as it is
        log_level="error",  # a malformed request or one over the limits is the client's problem, not a line in the log
        access_log=False,
        proxy_headers=False,
        server_header=False,
        limit_concurrency=limits.max_connections,
        timeout_keep_alive=max(1, math.ceil(limits.idle_timeout_s)),
        timeout_graceful_shutdown=2,
        backlog=BACKLOG,
    )
    return uvicorn.Server(config)


class _App:
    """The ASGI application: one JSON answer per request."""

    def __init__(self, endpoint):
        self.endpoint = endpoint

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        status, payload, headers = await self._answer(request)
        await JSONResponse(payload, status, headers=headers)(scope, receive, send)

    async def _answer(self, request: Request) -> tuple[int, dict, dict]:
        endpoint, limits = self.endpoint, self.endpoint.limits
        if not endpoint.authorised(request.headers.get("authorization", "")):
            return *error(
                401, "invalid API key: use the api_key of the client the trainer gave the agent", "invalid_api_key"
            ), CLOSE
        episode, route = split_path(request.url.path)
        if request.method == "GET":
            if route == "/v1/models":
                return 200, endpoint.models(), {}
            return *error(
                404, f"no GET route {route}; this endpoint serves /v1/models, /v1/chat/completions and /v1/completions"
            ), {}
        if request.method != "POST" or route not in ROUTES:
            return *error(
                404,
                f"no route {request.method} {route}; this endpoint serves POST /v1/chat/completions and /v1/completions",
            ), {}
        handler = endpoint.handler(episode)
        if handler is None:
            message = "this episode has ended (it returned, passed its deadline, or the run stopped); its client cannot sample any more"
            return *error(404, message, "episode_ended"), {}
        max_bytes = int(limits.max_request_mb * 2**20)
        declared = request.headers.get("content-length")
        if declared is not None and int(declared) > max_bytes:  # h11 has checked it is a number
            return *_too_large(limits.max_request_mb), {}
        if endpoint.in_flight >= limits.max_requests_in_flight:
            message = (
                f"the endpoint has {endpoint.in_flight} requests in flight (model.agent.init_args.limits."
                "max_requests_in_flight): retry in a moment"
            )
            return *error(503, message, "overloaded"), {"retry-after": "1"}
        endpoint.in_flight += 1
        try:
            try:
                body = await asyncio.wait_for(read_body(request, max_bytes), limits.body_timeout_s)
            except asyncio.TimeoutError:
                return *error(
                    408, f"the request body did not arrive within {limits.body_timeout_s} s", "timeout"
                ), CLOSE
            except ClientDisconnect:
                return *error(400, "the client closed the connection during the request"), CLOSE
            if body is None:
                return *_too_large(limits.max_request_mb), {}
            parsed = parse_json(body)
            if isinstance(parsed, tuple):
                return *parsed, {}
            status, payload = await asyncio.wrap_future(handler(ROUTES[route], parsed))
            return status, payload, {}
        finally:
            endpoint.in_flight -= 1


async def read_body(request: Request, max_bytes: int) -> bytes | None:
    """The whole body, or None once it passes ``max_bytes`` (what arrived is dropped; the rest is never read)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(max_mb: float) -> tuple[int, dict]:
    return error(
        413,
        f"the request body is larger than {max_mb:g} MiB (model.agent.init_args.limits.max_request_mb)",
        "request_too_large",
    )
