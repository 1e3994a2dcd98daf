"""`Connection`: a rollout's (or a teacher's) servers: ``servers.launch_servers`` started if asked to (rank 0), every
one checked to answer, a client and a request pool, reconnected after ``close``; ``close`` ends what was started.
`Connection.map` spreads one call per job over the servers (a rollout's samples, a teacher's scores)."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import torch.distributed as dist
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from .engine import ScoringEngine
from .fanout import wait_for_answers
from .http import HTTPClient
from .launch import LaunchedServer
from .ranks import rank, share
from .settings import Servers


class Connection:
    """``urls``: where requests go (a launched server's own address once started); ``engine`` talks to them."""

    def __init__(
        self,
        servers: Servers,
        engine_type: type[ScoringEngine],
        key: str = "model.rollout.init_args",
        configure: Callable[[ScoringEngine], None] | None = None,
    ):
        """``servers``: held here, the one copy its owner (a rollout or a teacher) reads; ``key``: the config key of
        the owner's settings (messages name it); ``configure``: called with each new engine before its servers are
        checked."""
        self.servers, self.engine_type = servers, engine_type
        self.key, self.configure = key, configure
        self.urls = list(servers.urls)
        self.launched: list[LaunchedServer] = []
        self.client: HTTPClient | None = None
        self.engine: ScoringEngine | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.default_model: str | None = None  # what a launch serves unless it names one (a rollout: the policy)

    @property
    def open(self) -> bool:
        return self.client is not None

    @property
    def server(self) -> LaunchedServer | None:
        """The (first) server launched here."""
        return self.launched[0] if self.launched else None

    def launched_at(self, url: str) -> LaunchedServer | None:
        return next((server for server in self.launched if server.url == url), None)

    def renew_engine(self) -> None:
        """A new engine object for the same servers (a restarted server joins no weight-transfer group of the old)."""
        if self.engine is not None:
            self.engine.close()
        self.engine = self.engine_type(self.client)
        if self.configure is not None:
            self.configure(self.engine)

    def connect(self, who: str, release_memory: bool) -> bool:
        """Start the server if asked to, build the client, check every server; True when the servers are new (a
        launched one holds its launch checkpoint)."""
        s = self.servers
        if release_memory and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise ValueError(
                f"{who}: weights.release_memory is for one colocated training process; with several ranks set it to "
                "false"
            )
        if s.launch is not None and rank() == 0:  # one server per job, started by rank 0
            launch = dict(s.launch)
            if self.default_model is not None:  # a local folder by its absolute path: the server may run elsewhere
                local = os.path.exists(self.default_model)
                launch.setdefault(
                    self.engine_type.model_key, os.path.abspath(self.default_model) if local else self.default_model
                )
            owner = self.key.split(".")[1]
            engine, started = self.engine_type.client_type.error.engine, time.monotonic()
            served = launch[self.engine_type.model_key]
            if served == os.path.abspath(self.default_model or ""):
                served = self.default_model  # as the config names it
            try:
                for _ in range(s.launch_servers):  # each command picks a free port of its own
                    command = self.engine_type.command(launch, s.launch_python)
                    self.launched.append(LaunchedServer(command, self.engine_type.client_type, owner=owner))
                    rank_zero_info(
                        f"starting {engine} on the {'policy' if owner == 'rollout' else owner} ({served}) at "
                        f"{self.launched[-1].url} for model.{owner}; its log: {self.launched[-1].log_path}"
                    )
                for server in self.launched:
                    server.wait_ready(s.launch_timeout_s)
            except BaseException:
                self._stop_launched()
                raise
            rank_zero_info(f"{engine} ready in {time.monotonic() - started:.0f} s")
        if s.launch is not None:
            self.urls = list(share([server.url for server in self.launched] if rank() == 0 else None))
        self.client = self.engine_type.client_type(
            s.timeout_s, s.max_retries, s.backoff, death_note=self._death_note, url_key=f"{self.key}.servers.urls"
        )
        self.engine = self.engine_type(self.client)
        if self.configure is not None:
            self.configure(self.engine)
        self.pool = ThreadPoolExecutor(s.max_concurrency, thread_name_prefix=f"{self.engine.name.lower()}-rollout")
        for url in self.urls:
            self.engine.health(url)
        return s.launch is not None

    def map(
        self, call: Callable[[str, Any], Any], jobs: Sequence, urls: list[str], watch: Callable[[], None] | None = None
    ) -> list:
        """``call(url, job)`` for every job on the request pool, job j on ``urls[j % len(urls)]``: every answer, in the
        order of ``jobs``, or the first failure (the other calls cancelled), within ``deadline_s``
        (`fanout.wait_for_answers`; ``watch``: called while calls are outstanding, what it raises ends the wait)."""
        futures = [self.pool.submit(call, urls[j % len(urls)], job) for j, job in enumerate(jobs)]
        s = self.servers
        return wait_for_answers(futures, s.deadline_s, s.progress_every_s, urls, self.client.error, watch)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
        self._stop_launched()
        self.client = None

    def _stop_launched(self) -> None:
        for server in self.launched:
            server.close()
        self.launched = []

    def _death_note(self, url: str) -> str | None:
        server = self.launched_at(url)
        return server.death_note() if server is not None else None
