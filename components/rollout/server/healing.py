"""`Healing`: servers that die or hang are restarted in place (launched ones) or waited for (``servers.urls`` ones), so
that one dead engine does not end a run.

A launched server is *down* when its process exited, or when it does not answer ``GET /health`` within
``health_deadline_s`` (a stopped process, a hung GPU: the kernel still accepts its connections, nothing answers). While
a rollout waits for its requests, `watch` looks at every launched server (its process each call, its health every few
seconds) and raises `ServerDown` naming the ones that are down; a request that fails for any other reason leads to the
same look (`down`) before the failure is accepted as final.

`recover` then restarts each launched server that is down, with the same command (same port: the URL, the weight
update URLs and the round-robin stay as they were), up to ``max_restarts`` per run, one printed line each; the whole
run stops past them (the trainer's fault handling writes last.ckpt; resuming restarts nothing it need not). A server
that is not ours (``base_url``) is waited for up to ``server_wait_s``, then the run stops with one line. A restarted
server holds its launch checkpoint: it samples again only once it has `rejoin`ed and the owner pushed the whole policy
(and the current LoRA adapter) and verified it. While other servers are up the restart runs in the background and
they keep sampling; the owner rejoins it at its next push, or at once when no server is left.
"""

from __future__ import annotations

import logging
import sys
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

from .group import in_background
from .http import ServerError
from .launch import LaunchedServer, port_taken
from .ranks import several_ranks

if TYPE_CHECKING:
    from .connection import Connection

log = logging.getLogger(__name__)

LIVENESS = "/health"
"""What a live server answers at once, even while generating (SGLang and vLLM both serve it)."""
HEALTH_EVERY_S = 5.0
"""How often `watch` asks the launched servers for their health while a rollout waits."""


class ServerDown(ServerError):
    """One or more servers died or stopped answering; ``urls`` names them."""

    def __init__(self, message: str, urls: list[str]):
        super().__init__(message)
        self.urls = urls


class Healing:
    """The restarts of one connection's servers: ``restarts`` so far (the ``servers/restarts`` metric), the ones still
    starting (``pending``: url -> the future of its readiness)."""

    def __init__(self, connection: Connection, who: str):
        self.connection, self.who = connection, who
        self.restarts = 0
        self.pending: dict[str, Future] = {}
        self._checked = 0.0  # when `watch` last asked for health

    def live_urls(self) -> list[str]:
        """The servers that take requests now (a restarting one does not)."""
        return [url for url in self.connection.urls if url not in self.pending]

    # ------------------------------------------------------------------ finding the dead
    def watch(self) -> None:
        """Called while a rollout waits: `ServerDown` once a launched server's process exited, or it did not answer its
        health check within ``health_deadline_s``."""
        launched = [url for url in self.live_urls() if self.connection.launched_at(url) is not None]
        dead = [url for url in launched if self.connection.launched_at(url).death_note() is not None]
        if not dead and time.monotonic() - self._checked >= HEALTH_EVERY_S:
            dead = [url for url in launched if not self._answers(url)]
            self._checked = time.monotonic()
        if dead:
            raise ServerDown(f"{self._engine()} server(s) down: {', '.join(dead)}", dead)

    def down(self, failure: BaseException) -> list[str]:
        """The servers behind ``failure`` that are down (none: the failure is not a server's death)."""
        if isinstance(failure, ServerDown):
            return failure.urls
        if not isinstance(failure, ServerError):
            return []
        return [url for url in self.live_urls() if not self._alive(url)]

    def _alive(self, url: str) -> bool:
        server = self.connection.launched_at(url)
        return (server is None or server.death_note() is None) and self._answers(url)

    def _answers(self, url: str) -> bool:
        try:
            self.connection.client.request(
                url, LIVENESS, method="GET", timeout_s=self.connection.servers.health_deadline_s, retries=0
            )
            return True
        except ServerError:
            return False

    # ------------------------------------------------------------------ bringing them back
    def recover(self, failure: BaseException, may_heal: bool = True) -> None:
        """After a failed rollout, push or scoring: restart (or wait for) the servers that are down, then return, for
        the caller to retry; raise ``failure`` when no server is down (or healing is off: ``may_heal`` False, several
        trainer ranks), the engine's error past ``max_restarts`` or ``server_wait_s``."""
        if not may_heal or several_ranks():
            raise failure
        down = self.down(failure)
        if not down:
            raise failure
        others_up = len(self.live_urls()) > len(down)
        for url in down:
            server = self.connection.launched_at(url)
            if server is None and self.connection.servers.server_wait_s == 0:
                raise failure
            if server is None:
                self._wait_for(url, failure)
            else:
                self._restart(server, failure, background=others_up)

    def rejoin(self, wait: bool) -> bool:
        """Restarted servers that are ready (``wait``: all of them, waiting) take requests again; True when any did:
        the caller pushes the whole policy before they sample."""
        joined = False
        for url, ready in list(self.pending.items()):
            if wait or ready.done():
                ready.result()  # the server did not start: the run stops with its log
                del self.pending[url]
                joined = True
        return joined

    def _restart(self, old: LaunchedServer, failure: BaseException, background: bool) -> None:
        s, error = self.connection.servers, self.connection.client.error
        reason = (old.death_note() or "").split(";")[0] or f"no answer to {LIVENESS} within {s.health_deadline_s:g} s"
        if self.restarts >= s.max_restarts:
            raise error(
                f"{self.who}: the {error.engine} server at {old.url} is down ({reason}) and its restarts are spent "
                f"({self.restarts} of max_restarts={s.max_restarts}); the run stops here (resume from its last "
                f"checkpoint). Log: {old.log_path}"
            ) from failure
        old.close(grace_s=0.0)  # its whole group, SIGKILL: a stopped (SIGSTOP) or hung process ends too
        freed = time.monotonic() + 30.0
        while port_taken(old.url) and time.monotonic() < freed:  # the group's last process lets go of the port
            time.sleep(0.2)
        new = LaunchedServer(old.command, type(self.connection.client), str(old.log_path.parent), old.owner)
        self.connection.launched[self.connection.launched.index(old)] = new
        self.restarts += 1
        line = (
            f"{self.who}: restarting the {error.engine} server at {old.url} ({reason}); restart {self.restarts} of "
            f"max_restarts={s.max_restarts}; log {new.log_path}"
        )
        print(line, file=sys.stderr, flush=True)
        log.info(line)
        if background:
            self.pending[new.url] = in_background(new.wait_ready, s.launch_timeout_s)
        else:
            new.wait_ready(s.launch_timeout_s)
            self.pending[new.url] = in_background(lambda: None)

    def _wait_for(self, url: str, failure: BaseException) -> None:
        s, error = self.connection.servers, self.connection.client.error
        print(
            f"{self.who}: the {error.engine} server at {url} is down; waiting up to server_wait_s={s.server_wait_s:g} s "
            "for it to come back",
            file=sys.stderr,
            flush=True,
        )
        deadline = time.monotonic() + s.server_wait_s
        while not self._answers(url):
            if time.monotonic() >= deadline:
                raise error(
                    f"{self.who}: the {error.engine} server at {url} did not come back within server_wait_s="
                    f"{s.server_wait_s:g} s; the run stops here (resume from its last checkpoint once it serves again). "
                    f"It failed with: {failure}"
                ) from failure
            time.sleep(1.0)
        self.pending[url] = in_background(lambda: None)  # back, with unknown weights: rejoins through a whole push

    def _engine(self) -> str:
        return self.connection.client.error.engine
