"""JSON over HTTP to SGLang's native API: timeouts, retries with exponential backoff, errors that name the server.

Standard library only (``urllib``), with proxies disabled: rollout servers sit on the cluster's own
network, and an ``http_proxy`` variable meant for the internet must not capture them.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from contextlib import contextmanager
from typing import Any, Callable, Iterator

log = logging.getLogger(__name__)

RETRY_STATUSES = (500, 502, 503, 504)
"""Server-side failures worth another attempt; a 4xx is a bad request and is raised at once."""


class SGLangError(RuntimeError):
    """A rollout server failed, could not be reached, or answered something we cannot use."""


class Retry(Exception):
    """Raised by a response ``check`` to have the request sent again (e.g. SGLang aborted it)."""


class SGLangClient:
    """POST/GET with retries. ``death_note(url)`` may explain a failure (a launched server's exit code and log)."""

    def __init__(
        self, timeout_s: float, max_retries: int, backoff: float, death_note: Callable[[str], str | None] | None = None
    ):
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff = backoff
        self.death_note = death_note
        self.gate = SamplingGate()  # generation requests pass it; a push of several requests closes it
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

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

        Connection failures, timeouts, ``retry_statuses`` and ``check`` raising `Retry` are retried
        ``retries`` (default ``max_retries``) times, sleeping ``backoff * 2**attempt`` seconds in between; then
        `SGLangError`.
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
        raise SGLangError(
            f"SGLang server at {url}: {method} {path} failed after {attempts} attempt(s); last error: {last}. "
            + (note or "Is the server running and reachable from here? Check model.rollout.init_args.base_url.")
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
            raise SGLangError(
                f"SGLang server at {url}: {method} {path} was refused with HTTP {err.code}: {detail}"
            ) from err
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


class SamplingGate:
    """Generation requests pass while no weight push runs. A push of several requests (buckets) closes the gate: it
    waits for the requests in flight and holds new ones back until it is done, because SGLang releases its
    ``model_update_lock`` between two requests and would let a request sample from a partly updated model. After a
    failed push every request fails at once until a push succeeds: a server holding part of a push is never sampled."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._closed = False
        self._failure: str | None = None

    @contextmanager
    def sampling(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._closed or self._failure is not None)
            if self._failure is not None:
                raise SGLangError(self._failure)
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def close(self) -> None:
        """New requests wait from now on (requests in flight go on)."""
        with self._cond:
            self._closed = True

    def wait_idle(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._active == 0)

    def open(self, failure: str | None = None) -> None:
        """The push is over: requests pass again, or (``failure``) fail with this message until the next push opens it."""
        with self._cond:
            self._closed, self._failure = False, failure
            self._cond.notify_all()


def wait_for_answers(futures: list[Future], deadline_s: float, progress_every_s: float, urls: list[str]) -> list[Any]:
    """Every future's result, in order; the first failure is raised at once.

    While requests are outstanding, a progress line (answered / pending, seconds waited) is logged every
    ``progress_every_s``; past ``deadline_s`` the wait ends with an `SGLangError` (a stopped or hung server
    otherwise means silence for up to ``(max_retries + 1) * timeout_s`` per request).
    """
    start = time.monotonic()
    pending = set(futures)
    while pending:
        waited = time.monotonic() - start
        if waited >= deadline_s:
            for f in futures:
                f.cancel()
            raise SGLangError(
                f"SGLang rollout: {len(futures) - len(pending)}/{len(futures)} requests answered within deadline_s={deadline_s:g} s "
                f"(model.rollout.init_args.deadline_s) from {', '.join(urls)}. A server may be stalled (stopped process, "
                "hung GPU, overloaded): check its log and /health_generate, or raise deadline_s for very long generations."
            )
        done, pending = wait(pending, timeout=min(progress_every_s, deadline_s - waited), return_when=FIRST_EXCEPTION)
        for f in done:
            if f.exception() is not None:
                for other in futures:
                    other.cancel()
                raise f.exception()
        if pending and time.monotonic() - start >= progress_every_s:
            log.warning(
                "SGLang rollout: waiting %.0f s for %s: %d/%d requests answered, %d pending (deadline_s=%g)",
                time.monotonic() - start,
                ", ".join(urls),
                len(futures) - len(pending),
                len(futures),
                len(pending),
                deadline_s,
            )
    return [f.result() for f in futures]
