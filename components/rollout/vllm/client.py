"""vLLM's client: the server layer's HTTP client, naming vLLM and raising `VLLMError`."""

from __future__ import annotations

from ..server.http import HTTPClient, ServerError


class VLLMError(ServerError):
    """A vLLM server failed, could not be reached, or answered something we cannot use."""

    engine = "vLLM"


class VLLMClient(HTTPClient):
    """POST/GET to vLLM servers with retries; failures raise `VLLMError` naming the server."""

    error = VLLMError
