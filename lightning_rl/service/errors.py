"""The service's errors, each one HTTP status and one line that names the field or the id at fault and the fix.

A request the service refuses is answered at once with the status and ``{"detail": <the line>, "field": <the
request's field, dotted>, "type": <kind>}``, which the SDK raises as ``tinker.BadRequestError`` (400),
``AuthenticationError`` (401), ``NotFoundError`` (404) and so on, the body in its message. A request accepted and then
failing while it runs (a bad token id found in the forward pass, a checkpoint that does not load) fails its future
instead: ``retrieve_future`` answers ``{"error": <the line>, "category": "user" | "server"}``, which the SDK raises as
``tinker.RequestFailedError``.
"""

from __future__ import annotations


class ServiceError(Exception):
    """A refusal: ``status``, the ``field`` at fault (dotted, as the SDK's request names it; None when no one field is),
    and a message that says what to change."""

    status = 400
    kind = "bad_request"

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message, self.field = message, field

    def body(self) -> dict:
        return {"detail": self.message, "field": self.field, "type": self.kind}


class BadRequest(ServiceError):
    """A field the service cannot take: malformed, out of range, or a feature it does not have."""


class Unauthorized(ServiceError):
    status, kind = 401, "unauthorized"


class NotFound(ServiceError):
    """An id (session, model, sampler, future, checkpoint) this key never created, or one that has expired."""

    status, kind = 404, "not_found"


class Gone(ServiceError):
    """A session that has finished or expired: its clients stop (the SDK ends its heartbeat on 410)."""

    status, kind = 410, "gone"


class TooLarge(ServiceError):
    status, kind = 413, "request_too_large"


class UnsupportedMedia(ServiceError):
    status, kind = 415, "unsupported_media_type"


class Busy(ServiceError):
    """A client's queue is full: the SDK retries a 429 with backoff."""

    status, kind = 429, "queue_full"
