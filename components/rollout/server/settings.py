"""A server rollout's settings, grouped by what reads them: the servers and how to reach them (`Servers`), how weights
get to them (`WeightPush`), and how a push is checked (`Verification`). In a config each is a group of its own under
the rollout's (or teacher's) ``init_args``: ``servers:``, ``weights:``, ``verify:``. Each is a frozen value checked
once, by the component that takes it, with errors that name the component and the key to change; sampling settings
are `SamplingParams`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch


def _urls(urls: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return tuple(u.rstrip("/") for u in ([urls] if isinstance(urls, str) else urls))


@dataclass(frozen=True)
class Servers:
    """Where the servers are (or how to start them) and how requests to them behave."""

    urls: tuple[str, ...] = ()
    """Running server(s) (``http://host:port``) or a router in front of them; requests are spread over them (a trailing
    ``/`` is dropped; in Python one URL may be given as a string)."""
    launch: dict | None = None
    """Instead of ``urls``, start the engine's server with these arguments (``True`` = bare flag; the checkpoint it
    serves defaults to the policy's, or for a teacher the built-in task's teacher) and stop it on ``close``."""
    launch_python: str | None = None
    """Interpreter that has the engine installed (None: the engine's default)."""
    launch_timeout_s: float = 900.0
    """Seconds to wait for a launched server to answer its health check."""
    timeout_s: float = 600.0
    """Seconds to wait for one answer (a whole generate or scoring request, or a weight update)."""
    max_retries: int = 3
    """Extra attempts after a timeout, a dropped connection, a 5xx or an aborted request."""
    backoff: float = 1.0
    """Seconds before the first retry, doubled for each further one."""
    max_concurrency: int = 64
    """Requests in flight at once, over all servers."""
    deadline_s: float = 1800.0
    """Seconds one rollout (every request of a batch, retries included), or the scoring of one micro-batch, may take
    before it fails."""
    progress_every_s: float = 60.0
    """While a rollout is slower than this, log its progress (answered / pending) this often."""
    max_restarts: int = 3
    """Launched servers that die or hang are restarted in place, up to this many times per run (the rollout, push or
    scoring in flight is retried; a restarted rollout server gets the whole policy, verified, before it samples); past
    it the run stops (last.ckpt resumes it). Synchronous training on one process."""
    server_wait_s: float = 300.0
    """A server at one of ``urls`` that stops answering is waited for this long, then the run stops."""
    health_deadline_s: float = 60.0
    """A launched server that does not answer ``GET /health`` within this long is down (a stopped or hung process) and
    is restarted."""
    launch_servers: int = 1
    """How many servers ``launch`` starts (each on a port of its own); requests are spread over them, and while one
    restarts the others keep working."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "urls", _urls(self.urls))

    def check(self, who: str) -> None:
        if bool(self.urls) == (self.launch is not None):
            raise ValueError(
                f"{who}: set exactly one of servers.urls (running servers) or servers.launch (server arguments)"
            )
        if self.deadline_s <= 0 or self.progress_every_s <= 0:
            raise ValueError(
                f"{who}: servers.deadline_s ({self.deadline_s}) and servers.progress_every_s ({self.progress_every_s}) "
                "must be > 0"
            )
        if self.max_retries < 0 or self.max_concurrency < 1:
            raise ValueError(
                f"{who}: servers.max_retries ({self.max_retries}) must be >= 0 and servers.max_concurrency "
                f"({self.max_concurrency}) >= 1"
            )
        if self.max_restarts < 0 or self.launch_servers < 1:
            raise ValueError(
                f"{who}: servers.max_restarts ({self.max_restarts}) must be >= 0 and servers.launch_servers "
                f"({self.launch_servers}) >= 1"
            )
        if not (self.server_wait_s >= 0 and self.health_deadline_s > 0):
            raise ValueError(
                f"{who}: servers.server_wait_s ({self.server_wait_s}) must be >= 0 and servers.health_deadline_s "
                f"({self.health_deadline_s}) > 0"
            )
        if self.launch_servers > 1 and self.launch is not None and "port" in self.launch:
            raise ValueError(
                f"{who}: servers.launch_servers {self.launch_servers} needs a port each: leave port out of "
                "servers.launch"
            )


@dataclass(frozen=True)
class WeightPush:
    """How the policy's weights reach the servers after every update."""

    weight_sync: Literal["disk", "tensor", "distributed"] = "disk"
    """``disk`` (save safetensors to ``weight_dir``, the server loads them), ``tensor`` (CUDA IPC: the server must share
    this host and GPU) or ``distributed`` (rank 0 and every server in process groups; each push is broadcast bucket by
    bucket: no folder, servers on any host)."""
    weight_dir: str | None = None
    """Directory the servers can read, for ``disk`` (None = a temporary one, same host only)."""
    weight_update_urls: tuple[str, ...] | None = None
    """Servers that receive weight updates (None = ``servers.urls``); list the workers here when ``servers.urls`` is a
    router."""
    bucket_mb: float = 512
    """Size of one weight-update request (``tensor``, ``distributed``); with FSDP2 a ``distributed`` push holds at most
    two buckets of full (gathered) tensors at a time."""
    master_address: str | None = None
    """For ``distributed``, this host's address as the servers reach it (rank 0 hosts the group's rendezvous; None =
    the address on the route to the first server)."""
    master_port: int | None = None
    """For ``distributed``, the rendezvous port on ``master_address`` (None = a free one); with a group per server,
    server i's group meets at ``master_port + i``."""
    group_backend: Literal["nccl", "gloo"] | None = None
    """For ``distributed``, ``nccl`` or ``gloo`` (None = nccl when the policy is on a GPU)."""
    group_per_server: bool | None = None
    """For ``distributed``, each server in a group of its own with rank 0, broadcast to all at once, instead of one
    group of all (None = per server with gloo, whose broadcast sends to the servers one after the other; one group with
    NCCL, which pipelines the broadcast through the servers)."""
    flush_cache: bool = True
    """Drop the servers' prefix cache after each update (it holds KV of the old weights)."""
    release_memory: bool = False
    """Release the servers' GPU memory between rollouts and resume it before the next (colocated training; the engine
    must support it)."""
    sync_before_first_rollout: bool = True
    """Push the policy's weights before the first rollout, so a server started from another checkpoint (or a resumed
    run) samples from the trained policy."""
    lora_sync: Literal["adapter", "merged"] = "adapter"
    """For a LoRA policy, push the adapter alone (``adapter``: from memory; the server must run with LoRA enabled and a
    rank covering the adapter's) or the base with the adapters merged in (``merged``: as ``weight_sync``)."""
    partial_rollouts: bool = False
    """Asynchronous training (``loop.max_staleness`` > 0): a weight push interrupts the requests in flight, which then
    continue with the new weights; each token keeps the version that sampled it (``token_versions``) and its log-prob
    under that version, so the off-policy correction is per token. False: a push waits for the requests in flight, and
    every response comes from one version."""

    def __post_init__(self) -> None:
        if self.weight_update_urls is not None:
            object.__setattr__(self, "weight_update_urls", _urls(self.weight_update_urls) or None)

    @property
    def bucket_bytes(self) -> int:
        return int(self.bucket_mb * 2**20)

    def check(self, who: str) -> None:
        if self.weight_sync not in ("disk", "tensor", "distributed"):
            raise ValueError(
                f"{who}: weights.weight_sync must be 'disk', 'tensor' or 'distributed', got {self.weight_sync!r}"
            )
        if self.weight_sync == "tensor" and not torch.cuda.is_available():
            raise ValueError(
                f"{who}: weights.weight_sync: tensor hands CUDA memory to the server (CUDA IPC), and this process has "
                "no CUDA device: CPU tensors cannot reach a server in another process. Use weights.weight_sync: disk "
                "(or distributed)"
            )
        if self.group_backend not in (None, "nccl", "gloo") or not self.bucket_mb > 0:
            raise ValueError(
                f"{who}: need weights.group_backend nccl/gloo/null and weights.bucket_mb > 0; got "
                f"{self.group_backend!r}, {self.bucket_mb}"
            )
        if self.lora_sync not in ("adapter", "merged"):
            raise ValueError(f"{who}: weights.lora_sync must be 'adapter' or 'merged', got {self.lora_sync!r}")


@dataclass(frozen=True)
class Verification:
    """How each push is checked: the servers' own checksums (exact) and a probe of log-probs (numeric)."""

    every: int = 1
    """After every N-th push, check each server holds the pushed weights (0 = never); a mismatch fails the iteration.
    Two checks: the server's own checksums (``checksums``) and a probe, the log-probs of its greedy continuation of a
    fixed prompt (and picture, for a vision-language policy) against the trainer's."""
    tolerance: float = 0.1
    """Largest mean |log-prob difference| on the probe that passes (an fp32 sampler ~1e-6, a bf16 one about
    rollout/logprob_diff_mean; set a few times that)."""
    checksums: bool = True
    """The exact check: every tensor the trainer changed since the push before must have changed on the server (its
    checksums before and after the push, names mapped through the engine's fusions); a tensor it did not load is
    named."""

    def check(self, who: str) -> None:
        if self.every < 0 or not self.tolerance > 0:
            raise ValueError(
                f"{who}: need verify.every >= 0 and verify.tolerance > 0; got {self.every}, {self.tolerance}"
            )
