"""`Engine`: what a server rollout asks of one inference engine, over its HTTP API. An engine is a thin mapping of
these calls to its own endpoints and JSON; everything else (fan-out over servers, retries, version stamps, partial
rollouts, launch and health, bucketed pushes, adapters kept for requests in flight, verification) is the rollout's.

Weights reach a server in one of three ways (``WeightPush.weight_sync``): a folder of safetensors the server reads
(``disk``), or `WeightBuckets` (an iterator of ``(name, tensor)`` buckets) sent as CUDA IPC handles (``tensor``) or
through a process group (``distributed``). A LoRA policy may send its adapter alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from torch import Tensor

from .buckets import WeightBuckets
from .http import HTTPClient
from .launch import Command
from .samples import Answer, Request
from .settings import WeightPush


class Engine(ABC):
    """One engine's mapping; ``client`` talks to its servers (retries, the sampling gate, the engine's errors)."""

    client_type: ClassVar[type[HTTPClient]]
    """The engine's client class (its error class names the engine)."""
    model_key: ClassVar[str]
    """The ``launch`` argument naming the checkpoint to serve (the policy's, when ``launch`` leaves it out)."""
    fusions: ClassVar[dict[str, str]] = {}
    """Module names the engine fuses on load, trainer name -> the engine's (``q_proj`` -> ``qkv_proj``): a checksum
    of the fused tensor stands for each of its parts."""

    def __init__(self, client: HTTPClient, push: WeightPush | None = None):
        self.client = client
        self.push = push or WeightPush()

    @property
    def name(self) -> str:
        return self.client.error.engine

    # ------------------------------------------------------------------ servers
    @classmethod
    @abstractmethod
    def command(cls, launch: dict, python: str | None) -> Command:
        """How to start a server with ``launch`` (the rollout's ``launch`` argument) under ``python`` (the rollout's
        ``launch_python``; None: the engine's default)."""

    @abstractmethod
    def health(self, url: str) -> None:
        """Return once the server at ``url`` can generate; the engine's error otherwise."""

    # ------------------------------------------------------------------ sampling
    @abstractmethod
    def generate(self, url: str, request: Request, adapter: str | None, keep_aborted: bool) -> list[Answer]:
        """``request.n`` answers, in order. A request the server aborted is sent again (`Retry`) unless
        ``keep_aborted``, which returns it with finish ``abort`` and the tokens sampled so far."""

    @abstractmethod
    def score(
        self, url: str, prompt: list[int], continuation: list[int], images: list[str] | None, adapter: str | None
    ) -> tuple[list[float], str | None]:
        """The server's log p(y_t | x, y_<t) of a given ``continuation`` of ``prompt`` (with its ``images``), and its
        weight version."""

    # ------------------------------------------------------------------ weights
    @abstractmethod
    def push_folder(self, urls: list[str], folder: str, version: int, abort: bool) -> None:
        """Every server loads the checkpoint in ``folder`` as ``version``. ``abort``: end the requests in flight first
        (partial rollouts continue them with the new weights); otherwise requests in flight finish on the old weights."""

    @abstractmethod
    def push_buckets(self, urls: list[str], weights: WeightBuckets, version: int, abort: bool, device: str) -> None:
        """Every server receives ``weights`` as ``version`` (``push.weight_sync``: tensor or distributed); no request
        samples from a partly updated server. Every trainer rank calls it (rank 0 sends, the others only gather);
        ``device``: where the policy is (``cuda``: NCCL)."""

    @abstractmethod
    def load_adapter(self, urls: list[str], name: str, config: dict, tensors: dict[str, Tensor]) -> None:
        """Every server loads a LoRA adapter (peft's config and tensors) under ``name``."""

    @abstractmethod
    def unload_adapter(self, urls: list[str], name: str) -> None: ...

    @abstractmethod
    def checksums(self, url: str) -> dict[str, str]:
        """{the server's tensor name: a digest of what it holds}, from the engine's own weight checker (several
        tensor-parallel ranks: each rank's digests of a name joined in one string, which changes when any does)."""

    @abstractmethod
    def pause(self, urls: list[str], abort: bool) -> None:
        """Stop generating: ``abort`` ends the requests in flight now (finish ``abort``, the tokens so far), otherwise
        the servers hold new requests once the ones in flight are answered."""

    @abstractmethod
    def resume(self, urls: list[str]) -> None: ...

    def flush_cache(self, urls: list[str]) -> None:
        """Forget cached KV of the old weights (engines whose updates do not)."""

    def release_memory(self, urls: list[str]) -> None:
        raise self.client.error(f"{self.name} rollout: release_memory is not supported by this engine")

    def resume_memory(self, urls: list[str]) -> None:
        raise self.client.error(f"{self.name} rollout: release_memory is not supported by this engine")

    def close(self) -> None:
        """Tear down what pushes set up (weight-transfer groups); best effort, servers may be gone."""
