"""SGLang's client: the server layer's HTTP client and gate, naming SGLang and raising `SGLangError`."""

from __future__ import annotations

from ..server import gate
from ..server.http import RETRY_STATUSES, HTTPClient, Retry, ServerError

__all__ = ["RETRY_STATUSES", "Retry", "SGLangClient", "SGLangError", "SamplingGate"]


class SGLangError(ServerError):
    """An SGLang server failed, could not be reached, or answered something we cannot use."""

    engine = "SGLang"


class SGLangClient(HTTPClient):
    """POST/GET to SGLang servers with retries; failures raise `SGLangError` naming the server."""

    error = SGLangError


class SamplingGate(gate.SamplingGate):
    error = SGLangError
