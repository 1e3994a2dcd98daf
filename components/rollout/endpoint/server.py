"""`Endpoint`: the loopback HTTP server an agent's OpenAI client talks to during rollout.

Each episode gets its own path, ``http://127.0.0.1:<port>/<episode>/v1``, and every request must carry the run's
token as its API key (``Authorization: Bearer <token>``): the server listens on 127.0.0.1 only, and nothing on the
machine without the token can drive the sampler. A request is handed to the episode's handler, which answers once
the sampler has (the call blocks its own connection thread, never the sampler). Errors answer in OpenAI's shape,
``{"error": {"message", "type", "code"}}``, so an OpenAI client raises them as `openai.APIStatusError`.
"""

from __future__ import annotations

import hmac
import json
import secrets
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

Handler = Callable[[str, dict], tuple[int, dict]]
"""(route: ``chat.completions`` or ``completions``, the request's JSON body) -> (HTTP status, JSON answer)."""

ROUTES = {"/v1/chat/completions": "chat.completions", "/v1/completions": "completions"}


def error(status: int, message: str, code: str | None = None) -> tuple[int, dict]:
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}.get(
        status, "server_error"
    )
    return status, {"error": {"message": message, "type": kind, "code": code, "param": None}}


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # every episode of a round connects at once; socketserver's 5 refused some of them

    def handle_error(self, request, client_address) -> None:
        # a pooled client drops idle keep-alive connections when it likes: not an error worth a trace on the run's log
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Endpoint:
    """An OpenAI-compatible server on loopback, routing each episode's requests to its handler."""

    def __init__(self, model_name: str = "policy"):
        self.token = secrets.token_urlsafe(32)
        self.model_name = model_name
        self._handlers: dict[str, Handler] = {}
        self._lock = threading.Lock()
        endpoint = self

        class _Request(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: an agent's calls reuse one connection

            def log_message(self, *args) -> None:  # one line per request on stderr would drown the run's output
                pass

            def do_GET(self) -> None:
                self._answer(*endpoint._get(self.path, self.headers.get("Authorization", "")))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                self._answer(*endpoint._post(self.path, self.headers.get("Authorization", ""), body))

            def _answer(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = _Server(("127.0.0.1", 0), _Request)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="openai-endpoint", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def base_url(self, episode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{episode}/v1"

    def open(self, episode: str, handler: Handler) -> None:
        with self._lock:
            self._handlers[episode] = handler

    def close_episode(self, episode: str) -> None:
        with self._lock:
            self._handlers.pop(episode, None)

    def _authorised(self, header: str) -> bool:
        return hmac.compare_digest(header.encode(), f"Bearer {self.token}".encode())

    def _split(self, path: str) -> tuple[str, str]:
        episode, _, rest = path.lstrip("/").partition("/")
        return episode, "/" + rest.split("?", 1)[0]

    def _get(self, path: str, auth: str) -> tuple[int, dict]:
        if not self._authorised(auth):
            return error(
                401, "invalid API key: use the api_key of the client the trainer gave the agent", "invalid_api_key"
            )
        _, route = self._split(path)
        if route == "/v1/models":
            return 200, {
                "object": "list",
                "data": [{"id": self.model_name, "object": "model", "created": 0, "owned_by": "lightning-rl"}],
            }
        return error(
            404, f"no GET route {route}; this endpoint serves /v1/models, /v1/chat/completions and /v1/completions"
        )

    def _post(self, path: str, auth: str, body: bytes) -> tuple[int, dict]:
        if not self._authorised(auth):
            return error(
                401, "invalid API key: use the api_key of the client the trainer gave the agent", "invalid_api_key"
            )
        episode, route = self._split(path)
        if route not in ROUTES:
            return error(404, f"no route {route}; this endpoint serves /v1/chat/completions and /v1/completions")
        with self._lock:
            handler = self._handlers.get(episode)
        if handler is None:
            return error(
                404,
                "this episode has ended (it returned, passed its deadline, or the run stopped); its client "
                "cannot sample any more",
                "episode_ended",
            )
        try:
            request = json.loads(body or b"{}")
        except ValueError as err:
            return error(400, f"the request body is not JSON: {err}")
        if not isinstance(request, dict):
            return error(400, "the request body must be a JSON object")
        return handler(ROUTES[route], request)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
