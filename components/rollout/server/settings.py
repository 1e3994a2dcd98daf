"""A server rollout's settings, grouped by what reads them: the servers and how to reach them (`Servers`), how weights
get to them (`WeightPush`), and how a push is checked (`Verification`). Each is a frozen value checked once, at
construction, with errors that name the rollout and the fix; sampling settings are `SamplingParams`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch


@dataclass(frozen=True)
class Servers:
    """Where the servers are (or how to start one) and how requests to them behave."""

    urls: tuple[str, ...] = ()
    launch: dict | None = None
    launch_python: str | None = None
    launch_timeout_s: float = 900.0
    timeout_s: float = 600.0
    max_retries: int = 3
    backoff: float = 1.0
    max_concurrency: int = 64
    deadline_s: float = 1800.0
    progress_every_s: float = 60.0
    max_restarts: int = 3
    server_wait_s: float = 300.0
    health_deadline_s: float = 60.0
    launch_servers: int = 1

    @staticmethod
    def urls_of(base_url: str | list[str] | None) -> tuple[str, ...]:
        return tuple(u.rstrip("/") for u in ([base_url] if isinstance(base_url, str) else list(base_url or [])))

    def check(self, who: str) -> None:
        if bool(self.urls) == (self.launch is not None):
            raise ValueError(f"{who}: set exactly one of base_url (running servers) or launch (server arguments)")
        if self.deadline_s <= 0 or self.progress_every_s <= 0:
            raise ValueError(
                f"{who}: deadline_s ({self.deadline_s}) and progress_every_s ({self.progress_every_s}) must be > 0"
            )
        if self.max_retries < 0 or self.max_concurrency < 1:
            raise ValueError(
                f"{who}: max_retries ({self.max_retries}) must be >= 0 and max_concurrency ({self.max_concurrency}) >= 1"
            )
        if self.max_restarts < 0 or self.launch_servers < 1:
            raise ValueError(
                f"{who}: max_restarts ({self.max_restarts}) must be >= 0 and launch_servers ({self.launch_servers}) >= 1"
            )
        if not (self.server_wait_s >= 0 and self.health_deadline_s > 0):
            raise ValueError(
                f"{who}: server_wait_s ({self.server_wait_s}) must be >= 0 and health_deadline_s "
                f"({self.health_deadline_s}) > 0"
            )
        if self.launch_servers > 1 and self.launch is not None and "port" in self.launch:
            raise ValueError(f"{who}: launch_servers {self.launch_servers} needs a port each: leave port out of launch")


@dataclass(frozen=True)
class WeightPush:
    """How the policy's weights reach the servers after every update."""

    weight_sync: Literal["disk", "tensor", "distributed"] = "disk"
    weight_dir: str | None = None
    weight_update_urls: tuple[str, ...] | None = None
    bucket_mb: float = 512
    master_address: str | None = None
    master_port: int | None = None
    group_backend: Literal["nccl", "gloo"] | None = None
    group_per_server: bool | None = None
    flush_cache: bool = True
    release_memory: bool = False
    sync_before_first_rollout: bool = True
    lora_sync: Literal["adapter", "merged"] = "adapter"
    partial_rollouts: bool = False

    @property
    def bucket_bytes(self) -> int:
        return int(self.bucket_mb * 2**20)

    def check(self, who: str) -> None:
        if self.weight_sync not in ("disk", "tensor", "distributed"):
            raise ValueError(f"{who}: weight_sync must be 'disk', 'tensor' or 'distributed', got {self.weight_sync!r}")
        if self.weight_sync == "tensor" and not torch.cuda.is_available():
            raise ValueError(
                f"{who}: weight_sync: tensor hands CUDA memory to the server (CUDA IPC), and this process has no CUDA "
                "device: CPU tensors cannot reach a server in another process. Use weight_sync: disk (or distributed)"
            )
        if self.group_backend not in (None, "nccl", "gloo") or not self.bucket_mb > 0:
            raise ValueError(
                f"{who}: need group_backend nccl/gloo/null and bucket_mb > 0; got {self.group_backend!r}, {self.bucket_mb}"
            )
        if self.lora_sync not in ("adapter", "merged"):
            raise ValueError(f"{who}: lora_sync must be 'adapter' or 'merged', got {self.lora_sync!r}")


@dataclass(frozen=True)
class Verification:
    """How each push is checked: the servers' own checksums (exact) and a probe of log-probs (numeric)."""

    every: int = 1
    tolerance: float = 0.1
    checksums: bool = True

    def check(self, who: str) -> None:
        if self.every < 0 or not self.tolerance > 0:
            raise ValueError(
                f"{who}: need verify_every >= 0 and verify_tolerance > 0; got {self.every}, {self.tolerance}"
            )
