"""`PushState`: the one owner of what the pushes have done, read by ``generate`` while a push may run on another thread
(asynchronous training: a staged push runs on its own thread beside the trainer and the rollout thread)."""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class PushView:
    """One consistent reading of the state."""

    version: int  # the last version every server holds (0: the launch weights)
    failed: bool  # the servers may hold part of a push: the next rollout pushes the whole policy again first
    needs_sync: bool  # the servers hold the checkpoint they started from, not (yet) the policy's weights


class PushState:
    """Weight version, failure flag and first-push flag, changed only through these methods, under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version, self._failed, self._needs_sync = 0, False, True
        self._staged = 0  # the last version a staged push was given
        self._pushes = 0  # pushes started (every verify_every-th is verified)

    def view(self) -> PushView:
        with self._lock:
            return PushView(self._version, self._failed, self._needs_sync)

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    @property
    def failed(self) -> bool:
        with self._lock:
            return self._failed

    def next_version(self, staged: bool = False) -> int:
        """The version a push started now carries: the one after the version served (a failed push's number is used
        again), or for a ``staged`` push, which runs later on another thread, the one after every version reserved."""
        with self._lock:
            if not staged:
                return self._version + 1
            self._staged = max(self._staged, self._version) + 1
            return self._staged

    def count_push(self) -> int:
        """This push's ordinal (1 for the first)."""
        with self._lock:
            self._pushes += 1
            return self._pushes

    def served(self, version: int) -> None:
        """Every server holds ``version`` (a later version never goes back to an earlier one)."""
        with self._lock:
            self._version, self._failed, self._needs_sync = max(self._version, version), False, False

    def fail(self) -> None:
        with self._lock:
            self._failed = True

    def fresh_servers(self) -> None:
        """A (re)launched server holds its launch checkpoint: push before sampling."""
        with self._lock:
            self._needs_sync = True
