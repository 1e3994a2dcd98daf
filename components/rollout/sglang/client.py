"""SGLang's client: the server layer's HTTP client, gate and wait, naming SGLang and raising `SGLangError`."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from ..server import fanout, gate
from ..server.http import RETRY_STATUSES, HTTPClient, Retry, ServerError

__all__ = ["RETRY_STATUSES", "Retry", "SGLangClient", "SGLangError", "SamplingGate", "wait_for_answers"]


class SGLangError(ServerError):
    """An SGLang server failed, could not be reached, or answered something we cannot use."""

    engine = "SGLang"


class SGLangClient(HTTPClient):
    """POST/GET to SGLang servers with retries; failures raise `SGLangError` naming the server."""

    error = SGLangError


class SamplingGate(gate.SamplingGate):
    error = SGLangError


def wait_for_answers(futures: list[Future], deadline_s: float, progress_every_s: float, urls: list[str]) -> list[Any]:
    """`server.fanout.wait_for_answers` for SGLang servers."""
    return fanout.wait_for_answers(futures, deadline_s, progress_every_s, urls, SGLangError)
