"""`Connection`: a rollout's (or a teacher's) servers: one started if asked to (rank 0), every one checked to answer, a
client and a request pool, reconnected after ``close``; ``close`` ends what was started."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch.distributed as dist
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from .engine import ScoringEngine
from .http import HTTPClient
from .launch import LaunchedServer
from .ranks import rank, share
from .settings import Servers, WeightPush


class Connection:
    """``urls``: where requests go (a launched server's own address once started); ``engine`` talks to them."""

    def __init__(
        self,
        servers: Servers,
        engine_type: type[ScoringEngine],
        push: WeightPush,
        key: str = "model.rollout.init_args",
        configure: Callable[[ScoringEngine], None] | None = None,
    ):
        """``key``: the config key of the settings (messages name it); ``configure``: called with each new engine before
        its servers are checked."""
        self.settings, self.engine_type, self.push = servers, engine_type, push
        self.key, self.configure = key, configure
        self.urls = list(servers.urls)
        self.server: LaunchedServer | None = None
        self.client: HTTPClient | None = None
        self.engine: ScoringEngine | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.default_model: str | None = None  # what a launch serves unless it names one (a rollout: the policy)

    @property
    def open(self) -> bool:
        return self.client is not None

    def connect(self, who: str, release_memory: bool) -> bool:
        """Start the server if asked to, build the client, check every server; True when the servers are new (a
        launched one holds its launch checkpoint)."""
        s = self.settings
        if release_memory and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise ValueError(
                f"{who}: release_memory is for one colocated training process; with several ranks set it to false"
            )
        if s.launch is not None and rank() == 0:  # one server per job, started by rank 0
            launch = dict(s.launch)
            if self.default_model is not None:  # a local folder by its absolute path: the server may run elsewhere
                local = os.path.exists(self.default_model)
                launch.setdefault(
                    self.engine_type.model_key, os.path.abspath(self.default_model) if local else self.default_model
                )
            command = self.engine_type.command(launch, s.launch_python)
            owner = self.key.split(".")[1]
            self.server = LaunchedServer(command, self.engine_type.client_type, owner=owner)
            engine, started = self.engine_type.client_type.error.engine, time.monotonic()
            served = launch[self.engine_type.model_key]
            if served == os.path.abspath(self.default_model or ""):
                served = self.default_model  # as the config names it
            rank_zero_info(
                f"starting {engine} on the {'policy' if owner == 'rollout' else owner} ({served}) at {self.server.url} "
                f"for model.{owner}; its log: {self.server.log_path}"
            )
            try:
                self.server.wait_ready(s.launch_timeout_s)
            except BaseException:
                self.server.close()
                self.server = None
                raise
            rank_zero_info(f"{engine} ready in {time.monotonic() - started:.0f} s")
        if s.launch is not None:
            self.urls = [share(self.server.url if self.server is not None else None)]
        self.client = self.engine_type.client_type(
            s.timeout_s, s.max_retries, s.backoff, death_note=self._death_note, url_key=f"{self.key}.base_url"
        )
        self.engine = self.engine_type(self.client, self.push)
        if self.configure is not None:
            self.configure(self.engine)
        self.pool = ThreadPoolExecutor(s.max_concurrency, thread_name_prefix=f"{self.engine.name.lower()}-rollout")
        for url in self.urls:
            self.engine.health(url)
        return s.launch is not None

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
        if self.server is not None:
            self.server.close()
            self.server = None
        self.client = None

    def _death_note(self, url: str) -> str | None:
        return self.server.death_note() if self.server is not None and url == self.server.url else None
