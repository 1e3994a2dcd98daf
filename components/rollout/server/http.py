"""JSON over HTTP to a rollout server's API: timeouts, retries with exponential backoff, errors that name the server.

Standard library only (``urllib``), with proxies disabled: rollout servers sit on the cluster's own network, and an
``http_proxy`` variable meant for the internet must not capture them. Each engine's client names its engine in every
message (``SGLang server at http://...``) and raises the engine's own error class.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Callable

from .gate import SamplingGate

RETRY_STATUSES = (500, 502, 503, 504)
"""Server-side failures worth another attempt; a 4xx is a bad request and is raised at once."""


class ServerError(RuntimeError):
    """A rollout server failed, could not be reached, or answered something we cannot use."""

    engine = "Rollout"
    """The engine's name, as messages name it (``SGLang``, ``vLLM``)."""


class Retry(Exception):
    """Raised by a response ``check`` to have the request sent again (e.g. the server aborted it)."""


class HTTPClient:
    """POST/GET with retries. ``death_note(url)`` may explain a failure (a launched server's exit code and log)."""

    error: type[ServerError] = ServerError
    """What every failure raises: the engine's error class, which carries the engine's name."""

    def __init__(
        self,
        timeout_s: float,
        max_retries: int,
        backoff: float,
        death_note: Callable[[str], str | None] | None = None,
        url_key: str = "model.rollout.init_args.servers.urls",
    ):
        """``url_key``: the setting that names the servers, which a failure's message points to."""
        self.timeout_s = timeout_s
        self.url_key = url_key
        self.max_retries = max_retries
        self.backoff = backoff
        self.death_note = death_note
        self.gate = SamplingGate(self.error)  # generation requests pass it; a push of several requests closes it
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def fail(self, url: str, message: str) -> ServerError:
        """The engine's error for a server: ``<engine> server at <url><message>``."""
        return self.error(f"{self.error.engine} server at {url}{message}")

    def request(
        self,
        url: str,
        path: str,
        payload: Any = None,
        method: str = "POST",
        retry_statuses: tuple[int, ...] = RETRY_STATUSES,
        check: Callable[[Any], None] | None = None,
        timeout_s: float | None = None,
        retries: int | None = None,
    ) -> Any:
        """The decoded answer (JSON, or text when the body is not JSON).

        Connection failures, timeouts, ``retry_statuses`` and ``check`` raising `Retry` are retried ``retries``
        (default ``max_retries``) times, sleeping ``backoff * 2**attempt`` seconds in between; then the engine's error.
        """
        attempts = (self.max_retries if retries is None else retries) + 1
        last = ""
        for attempt in range(attempts):
            try:
                answer = self._once(url, path, payload, method, retry_statuses, timeout_s or self.timeout_s)
                if check is not None:
                    check(answer)
                return answer
            except Retry as reason:
                last = str(reason)
            if attempt + 1 < attempts:
                time.sleep(self.backoff * 2**attempt)
        note = self.death_note(url) if self.death_note is not None else None
        raise self.fail(
            url,
            f": {method} {path} failed after {attempts} attempt(s); last error: {last}. "
            + (note or f"Is the server running and reachable from here? Check {self.url_key}."),
        )

    def _once(
        self, url: str, path: str, payload: Any, method: str, retry_statuses: tuple[int, ...], timeout_s: float
    ) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with self._opener.open(req, timeout=timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace").strip()[:2000]
            if err.code in retry_statuses:
                raise Retry(f"HTTP {err.code}: {detail}") from err
            raise self.fail(url, f": {method} {path} was refused with HTTP {err.code}: {detail}") from err
        except urllib.error.URLError as err:
            if isinstance(err.reason, (TimeoutError, socket.timeout)):
                raise Retry(f"no answer within timeout_s={timeout_s}") from err
            raise Retry(f"unreachable ({err.reason})") from err
        except (TimeoutError, socket.timeout) as err:
            raise Retry(f"no answer within timeout_s={timeout_s}") from err
        except (http.client.HTTPException, ConnectionError) as err:
            raise Retry(
                f"connection dropped before an answer ({type(err).__name__}: {err}); the server may have died"
            ) from err
        text = body.decode(errors="replace")
        try:
            return json.loads(text) if text else None
        except json.JSONDecodeError:
            return text
