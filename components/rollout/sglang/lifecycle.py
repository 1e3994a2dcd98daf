"""`ServerConnection`: the servers' side of `SGLangRollout`'s life: start one if asked to (rank 0), check every server
generates, reconnect after ``close``, and on ``close`` end what was started (the weight group, the request threads,
a launched server, the temporary weights folder)."""

from __future__ import annotations

import shutil
import sys
from concurrent.futures import ThreadPoolExecutor

import torch.distributed as dist

from .client import SGLangClient
from .server import LaunchedServer
from .verify import probe_prompt
from .weights import rank


class ServerConnection:
    """The connection half of `SGLangRollout` (its attributes are set there)."""

    def setup(self, tokenizer) -> None:
        """Read eos/pad, start the server if asked to, and check every server answers ``/health_generate``."""
        super().setup(tokenizer)
        self._probe = probe_prompt(len(tokenizer))
        if self.client is None:
            self._connect()

    def _connect(self) -> None:
        if self.release_memory and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise ValueError(
                "SGLangRollout: release_memory is for one colocated training process; with several ranks set it to false"
            )
        if self.launch is not None and rank() == 0:  # one server per job, started by rank 0
            self.server = LaunchedServer(self.launch, self.launch_python or sys.executable)
            try:
                self.server.wait_ready(self.launch_timeout_s)
            except BaseException:
                self.server.close()
                self.server = None
                raise
        if self.launch is not None:
            self.urls = [self._broadcast_url()]
            self._needs_sync = True  # a fresh server holds the launch checkpoint
            self.adapter_name = None  # and no adapter
            self._adapters.clear()
        self.client = SGLangClient(self.timeout_s, self.max_retries, self.backoff, death_note=self._death_note)
        self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="sglang-rollout")
        for url in self.urls:
            self.client.request(url, "/health_generate", method="GET")

    def close(self) -> None:
        self.overlapping = False
        self._drop_group()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self.server is not None:
            self.server.close()
            self.server = None
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None
        self.client = None

    def _broadcast_url(self) -> str:
        url = [self.server.url if self.server is not None else None]
        if dist.is_available() and dist.is_initialized():
            dist.broadcast_object_list(url, src=0)
        return url[0]

    def _death_note(self, url: str) -> str | None:
        return self.server.death_note() if self.server is not None and url == self.server.url else None

    def _connected(self) -> SGLangClient:
        if self.client is None:
            if not hasattr(self, "eos_token_id"):
                raise RuntimeError(
                    "SGLangRollout.setup(tokenizer) must run before generate/sync_weights (RLModule.configure_model calls it)"
                )
            self._connect()  # used again after close() (e.g. trainer.validate after trainer.fit)
        return self.client
