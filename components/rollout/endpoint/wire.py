"""The endpoint's wire format, shared by its server (server.py) and its HTTP side (asgi.py): the routes, the listen
backlog, errors in OpenAI's shape (``{"error": {"message", "type", "code"}}``) and request parsing."""

from __future__ import annotations

from concurrent.futures import Future

from lightning_rl.core import untrusted_json

ROUTES = {"/v1/chat/completions": "chat.completions", "/v1/completions": "completions"}
BACKLOG = 4096
"""Connections the kernel queues before the server accepts them (every episode of a round connects at once)."""


def error(status: int, message: str, code: str | None = None) -> tuple[int, dict]:
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        413: "invalid_request_error",
        429: "rate_limit_error",
    }.get(status, "server_error")
    return status, {"error": {"message": message, "type": kind, "code": code, "param": None}}


def answered(status: int, payload: dict) -> Future:
    """A future already holding its answer (a call refused before it reaches the driver)."""
    future: Future = Future()
    future.set_result((status, payload))
    return future


def split_path(path: str) -> tuple[str, str]:
    """``/<episode>/v1/...`` -> (episode, ``/v1/...``)."""
    episode, _, rest = path.lstrip("/").partition("/")
    return episode, "/" + rest


def parse_json(body: bytes) -> dict | tuple[int, dict]:
    """The request body as a JSON object, or the 400 answer saying why it is not one (lightning_rl.core.untrusted_json:
    nested past its ``MAX_DEPTH``, or holding a number no float holds, it is refused before anything walks it)."""
    try:
        request = untrusted_json.loads(body or b"{}")
    except ValueError as err:
        return error(400, f"the request body is not JSON the endpoint takes: {err}")
    if not isinstance(request, dict):
        return error(400, "the request body must be a JSON object")
    return request
