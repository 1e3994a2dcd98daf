"""The service's HTTP side: the Tinker API's routes (``/api/v1/...``) on uvicorn + Starlette, the stack of the agents'
OpenAI endpoint (components/rollout/endpoint/asgi.py, whose head deadline and bounded body reader this reuses).

Each request is checked in the order that keeps a hostile or broken client cheap: the key in ``X-API-Key`` (401
before a byte of the body is read), the route (404), the declared size (413), then the body as a stream up to
``max_request_mb`` within ``body_timeout_s`` (413, 408), decompressed (``Content-Encoding: zstd``) up to the same
size. Answers are JSON, but for the results the SDK asks for in protobuf (``Accept: application/x-protobuf``).
``retrieve_future`` waits for its request up to ``long_poll_s`` and answers 408 "try again" (which the SDK retries at
once, with the queue's state) if it is not done.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import socket
import threading
import time

import uvicorn
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from components.rollout.endpoint.asgi import HeadDeadlineProtocol, read_body
from lightning_rl.service.checkpoints import tenant_of
from lightning_rl.service.errors import (
    BadRequest,
    Busy,
    NotFound,
    ServiceError,
    TooLarge,
    Unauthorized,
    UnsupportedMedia,
)
from lightning_rl.service.service import Service

log = logging.getLogger(__name__)
PROTOBUF = "application/x-protobuf"
API = "/api/v1/"


class App:
    """The ASGI application over a `Service`; ``keys`` are the API keys it accepts."""

    def __init__(self, service: Service, keys: list[str]):
        self.service, self.limits = service, service.limits
        self.tenants = [(key.encode(), tenant_of(key)) for key in keys]
        training, sampling = service.training, service.sampling
        self.json_routes = {
            "client/config": service.client_config,
            "client/dynamic_config": service.dynamic_config,
            "telemetry": service.telemetry,
            "create_session": service.create_session,
            "session_heartbeat": service.heartbeat,
            "cancel_future": service.cancel,
            "create_model": training.create_model,
            "get_info": training.get_info,
            "optim_step": training.optim_step,
            "save_weights": training.save_weights,
            "save_weights_for_sampler": training.save_weights_for_sampler,
            "load_weights": training.load_weights,
            "unload_model": training.unload_model,
            "create_sampling_session": sampling.create_sampling_session,
            "asample": sampling.asample,
        }
        self.get_routes = {
            "healthz": service.health,
            "get_server_capabilities": service.capabilities,
            "queues": service.queues,
        }

    def tenant(self, key: str) -> str | None:
        found = None
        for known, tenant in self.tenants:  # every key compared, in constant time: no timing tells which was close
            if hmac.compare_digest(key.encode(), known):
                found = tenant
        return found

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        try:
            response = await self._answer(request)
        except ServiceError as err:
            response = JSONResponse(err.body(), err.status)
        except ClientDisconnect:
            return  # the client went away mid-body: nothing was queued, nobody to answer
        except Exception:  # noqa: BLE001 (one request's bug must not take the server down)
            log.exception("a request to %s failed", request.url.path)
            response = JSONResponse({"detail": "internal error (see the service's log)", "type": "internal"}, 500)
        await response(scope, receive, send)

    async def _answer(self, request: Request) -> Response:
        tenant = self.tenant(request.headers.get("x-api-key", ""))
        if tenant is None:
            return JSONResponse(
                Unauthorized("missing or unknown API key: send the key the service was started with (TINKER_API_KEY)")
                .body(), 401, headers={"connection": "close"},
            )  # fmt: skip
        path = request.url.path
        if not path.startswith(API):
            raise NotFound(f"no route {path}: the Tinker API is under {API}")
        route = path[len(API) :]
        if request.method == "GET":
            if route in self.get_routes:
                return JSONResponse(self.get_routes[route](tenant, {}))
            if route.startswith("samplers/"):
                return JSONResponse(self.service.sampling.get_sampler(tenant, route[len("samplers/") :]))
            raise NotFound(f"no route GET {path}")
        if request.method != "POST":
            raise NotFound(f"no route {request.method} {path}")
        if route == "forward_backward":
            if request.headers.get("content-type", "").split(";")[0].strip() != PROTOBUF:
                raise UnsupportedMedia(f"forward_backward takes {PROTOBUF} bodies (the SDK's ForwardBackwardRequest)")
            return JSONResponse(self.service.training.forward_backward(tenant, await self._body(request)))
        body = _json(await self._body(request))
        if route == "retrieve_future":
            return await self._retrieve(tenant, body, PROTOBUF in request.headers.get("accept", ""))
        if route.startswith("sessions/") and route.endswith("/finish"):
            return JSONResponse(self.service.finish_session(tenant, route.split("/")[1], body))
        if route in self.json_routes:
            try:
                return JSONResponse(self.json_routes[route](tenant, body))
            except ServiceError as err:
                if not isinstance(err, Busy):  # a 429 is retried under the same number
                    self.service.refused(tenant, body.get("model_id"), body.get("seq_id"))
                raise
        raise NotFound(f"no route POST {path}")

    async def _body(self, request: Request) -> bytes:
        max_bytes = int(self.limits.max_request_mb * 2**20)
        declared = request.headers.get("content-length")
        if declared is not None and int(declared) > max_bytes:
            raise _too_large(self.limits.max_request_mb)
        try:
            body = await asyncio.wait_for(read_body(request, max_bytes), self.limits.body_timeout_s)
        except asyncio.TimeoutError:
            raise ServiceError(f"the request body did not arrive within {self.limits.body_timeout_s:g} s") from None
        if body is None:
            raise _too_large(self.limits.max_request_mb)
        encoding = request.headers.get("content-encoding", "").strip().lower()
        if encoding in ("", "identity"):
            return body
        if encoding != "zstd":
            raise UnsupportedMedia(f"Content-Encoding {encoding!r}: this service reads zstd or none")
        return _unzstd(body, max_bytes, self.limits.max_request_mb)

    async def _retrieve(self, tenant: str, body: dict, protobuf: bool) -> Response:
        future = self.service.future(tenant, body)
        if not await future.wait(self.service.config.long_poll_s):
            return JSONResponse(self.service.try_again(future), 408)
        if future.error is not None:
            return JSONResponse({"error": future.error, "category": future.category})
        if protobuf:
            encoded = future.answer.proto()
            if encoded is not None:
                return Response(encoded, media_type=PROTOBUF)
        return JSONResponse(future.answer.json())


def _json(body: bytes) -> dict:
    try:
        parsed = json.loads(body or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadRequest(f"the body is not JSON ({err})") from None
    if not isinstance(parsed, dict):
        raise BadRequest("the body must be a JSON object")
    return parsed


def _unzstd(body: bytes, max_bytes: int, max_mb: float) -> bytes:
    try:
        import zstandard
    except ImportError:
        raise UnsupportedMedia(
            "Content-Encoding zstd needs the zstandard package in the service's environment"
        ) from None
    try:
        out = zstandard.ZstdDecompressor().stream_reader(body).read(max_bytes + 1)
    except zstandard.ZstdError as err:
        raise BadRequest(f"the zstd body does not decompress ({err})") from None
    if len(out) > max_bytes:
        raise _too_large(max_mb)
    return out


def _too_large(max_mb: float) -> TooLarge:
    return TooLarge(f"the request body is larger than {max_mb:g} MiB (serve --limits.max_request_mb)")


class Server:
    """The service listening on ``host:port``: ``run()`` in the foreground (the command line) or ``start()`` on a
    thread of its own (tests, notebooks), ``stop()`` to end it."""

    def __init__(self, service: Service, keys: list[str], host: str, port: int):
        self.service = service
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(2048)
        self.host, self.port = host, self.sock.getsockname()[1]
        limits = service.limits
        config = uvicorn.Config(
            App(service, keys),
            http=HeadDeadlineProtocol,
            loop="asyncio",
            interface="asgi3",
            lifespan="off",
            ws="none",
            log_config=None,
            log_level="warning",
            access_log=False,
            proxy_headers=False,
            server_header=False,
            timeout_keep_alive=max(1, math.ceil(limits.idle_timeout_s)),
            timeout_graceful_shutdown=2,
        )
        self.uvicorn = uvicorn.Server(config)
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def run(self) -> None:
        try:
            self.uvicorn.run(sockets=[self.sock])
        finally:
            self.service.close()

    def start(self) -> "Server":
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.sock]}, name="tinker-service")
        self.thread.daemon = True
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.uvicorn.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the Tinker API service did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=10)
            if self.thread.is_alive():
                self.uvicorn.force_exit = True
                self.thread.join(timeout=5)
        self.service.close()
