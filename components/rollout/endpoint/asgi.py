"""The endpoint's HTTP side: a Starlette request handler on uvicorn's HTTP/1.1 (h11) protocol, with the limits of
`EndpointLimits` (server.py) enforced in the order that keeps a hostile or broken client cheap: a connection's slot
(given up by the oldest connection that has sent no request head yet), the episode's token on the head, the route
and the episode, the requests in flight, the bytes in flight, then the body as a stream up to its size and time
limit. Whatever else goes wrong on one request is a 500 for it and one line in the log, never the run's end."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import socket

import uvicorn
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from .admission import BytesInFlight, Slots
from .wire import BACKLOG, ROUTES, error, parse_json, split_path

CLOSE = {"connection": "close"}
"""On an answer to a client that is not the run's (or has stalled): closed with its body unread. A refusal to the
run's own client keeps the connection: uvicorn reads and drops the rest of the body (the head timer still bounds it),
so the client reads its answer rather than a reset."""
RETRY = {"retry-after": "1"}
log = logging.getLogger(__name__)


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request head: uvicorn's keep-alive timer starts only after an
    answer, so a connection that never sends a request, or sends its head a byte at a time, would be held forever
    (the agents' endpoint and the Tinker API service, lightning_rl.service, both serve with it)."""

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


class _Protocol(HeadDeadlineProtocol):
    """The head deadline with a slot per connection (admission.Slots) and each request handed to the app with its
    connection."""

    def __init__(self, *args, app: _App, **kwargs):
        super().__init__(*args, **kwargs)
        self.app = functools.partial(app, connection=self)
        self.slots = app.slots
        self.has_slot = True

    def connection_made(self, transport) -> None:
        H11Protocol.connection_made(self, transport)  # the slot is taken once the transport is known, then the deadline
        self.has_slot = self.slots.opened(self)
        self._await_head(None)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.cycle is not None:  # a request head arrived: the connection keeps its slot
            self.slots.stop_waiting(self)

    def connection_lost(self, exc) -> None:
        self.slots.stop_waiting(self)
        super().connection_lost(exc)


def serve(endpoint, sock: socket.socket) -> uvicorn.Server:
    """A uvicorn server of ``endpoint`` (an `Endpoint` of server.py, which imports this module when it starts) on the
    listening ``sock`` (not started: ``.run(sockets=[sock])``)."""
    limits = endpoint.limits
    app = _App(endpoint)
    config = uvicorn.Config(
        app,
        http=functools.partial(_Protocol, app=app),
        loop="asyncio",
        interface="asgi3",
        lifespan="off",
        ws="none",
        log_config=None,  # the trainer's logging stays as it is
        log_level="error",  # a malformed request or one over the limits is the client's problem, not a line in the log
        access_log=False,
        proxy_headers=False,
        server_header=False,
        limit_concurrency=None,  # admission.Slots and _App bound connections and requests
        timeout_keep_alive=max(1, math.ceil(limits.idle_timeout_s)),
        timeout_graceful_shutdown=2,
        backlog=BACKLOG,
    )
    return uvicorn.Server(config)


class _App:
    """The ASGI application: one JSON answer per request."""

    def __init__(self, endpoint):
        self.endpoint = endpoint
        self.slots = Slots(endpoint.limits.max_connections)
        self.bytes = BytesInFlight(endpoint.limits.max_bytes_in_flight)

    async def __call__(self, scope, receive, send, connection: _Protocol | None = None) -> None:
        if scope["type"] != "http":
            return
        try:
            status, payload, headers = await self._answer(Request(scope, receive), connection)
            response = JSONResponse(payload, status, headers=headers)
        except Exception as err:  # a fault of ours on one request: its client is told, the run goes on
            log.error("the agents' endpoint failed on a request to %s: %s: %s", scope["path"], type(err).__name__, err)
            status, payload = error(500, f"the endpoint failed on this request: {type(err).__name__}: {err}")
            response = JSONResponse(payload, status, headers=CLOSE)
        await response(scope, receive, send)

    async def _answer(self, request: Request, connection: _Protocol | None) -> tuple[int, dict, dict]:
        endpoint, limits = self.endpoint, self.endpoint.limits
        holder = endpoint.holder(request.headers.get("authorization", ""))
        if holder is None:
            return *error(
                401, "invalid API key: use the api_key of the client the trainer gave the agent", "invalid_api_key"
            ), CLOSE
        if connection is not None and not connection.has_slot:
            message = (
                f"the endpoint has {limits.max_connections} connections open, each serving a request "
                "(model.agent.init_args.limits.max_connections): retry in a moment"
            )
            return *error(503, message, "overloaded"), {**RETRY, **CLOSE}
        episode, route = split_path(request.url.path)
        if holder != episode:
            message = (
                "this API key is another episode's: each episode's client carries its own key, good at its own "
                "base_url only (use the client the trainer gave this episode)"
            )
            return *error(403, message, "wrong_episode"), {}
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
            return *error(503, message, "overloaded"), RETRY
        endpoint.in_flight += 1
        # no Content-Length: a chunked body (up to max_request_mb), or none at all
        chunked = "chunked" in request.headers.get("transfer-encoding", "").lower()
        share = int(declared) if declared is not None else max_bytes if chunked else 0
        try:
            await self.bytes.take(share)
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
                self.bytes.give(share - len(body))  # a chunked body's share was max_request_mb
                share = len(body)
                parsed = parse_json(body)
                del body  # the parsed request is what waits for the sampler
                if isinstance(parsed, tuple):
                    return *parsed, {}
                status, payload = await asyncio.wrap_future(handler(ROUTES[route], parsed))
                return status, payload, {}
            finally:
                self.bytes.give(share)
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
