"""Sessions: what one ``ServiceClient`` holds (its training clients and samplers), kept alive by its heartbeat.

The SDK opens a session when a ``ServiceClient`` first needs one and beats every 10 s. A session whose beats stop for
``session_timeout_s`` (its process died, or lost the network) ends, as one the client finished (``close``): its queued
requests fail, its models and samplers are dropped and their memory freed. Ids are random (a session id is 128 bits),
and every lookup is by the API key's tenant first: another key's session reads as no session.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field

from lightning_rl.service.errors import BadRequest, Gone, NotFound


@dataclass
class Session:
    id: str
    tenant: str
    user_metadata: dict
    last_beat: float = field(default_factory=time.monotonic)
    finished: str | None = None  # why it ended: "success", "errored", "interrupted" or "expired"
    models: set[str] = field(default_factory=set)
    samplers: set[str] = field(default_factory=set)
    next_sampler: int = 0


class Sessions:
    def __init__(self, timeout_s: float, max_per_tenant: int):
        self.timeout_s, self.max_per_tenant = timeout_s, max_per_tenant
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}

    def create(self, tenant: str, user_metadata: dict) -> Session:
        with self._lock:
            live = sum(1 for s in self._sessions.values() if s.tenant == tenant and s.finished is None)
            if live >= self.max_per_tenant:
                raise BadRequest(
                    f"this API key has {live} live sessions (serve limits.max_sessions_per_key): close some "
                    "(ServiceClient.close) or let them time out",
                    "session_id",
                )
            session = Session(secrets.token_hex(16), tenant, user_metadata)
            self._sessions[session.id] = session
            return session

    def get(self, tenant: str, session_id: str, live: bool = True) -> Session:
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None or session.tenant != tenant:
            raise NotFound(f"no session {session_id!r} for this API key", "session_id")
        if live and session.finished is not None:
            raise Gone(f"session {session_id} has ended ({session.finished}); open a new ServiceClient", "session_id")
        return session

    def beat(self, tenant: str, session_id: str) -> None:
        session = self.get(tenant, session_id)
        session.last_beat = time.monotonic()

    def finish(self, session: Session, reason: str) -> None:
        with self._lock:
            if session.finished is None:
                session.finished = reason

    def stale(self, now: float | None = None) -> list[Session]:
        """Live sessions without a beat for ``timeout_s``, marked expired."""
        now = time.monotonic() if now is None else now
        with self._lock:
            stale = [s for s in self._sessions.values() if s.finished is None and now - s.last_beat > self.timeout_s]
            for session in stale:
                session.finished = "expired"
            return stale

    def forget_finished(self, older_than_s: float, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            for key in [k for k, s in self._sessions.items() if s.finished and now - s.last_beat > older_than_s]:
                del self._sessions[key]

    def owned(self, tenant: str) -> list[Session]:
        with self._lock:
            return [s for s in self._sessions.values() if s.tenant == tenant]
