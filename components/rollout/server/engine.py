"""`Engine`: what a server rollout asks of one inference engine, over its HTTP API. An engine is a thin mapping of
these calls to its own endpoints and JSON; everything else (fan-out over servers, retries, version stamps, partial
rollouts, launch and health, bucketed pushes, adapters kept for requests in flight, verification) is the rollout's.

`ScoringEngine` is the part a server that only scores given tokens offers (a teacher's: `components.teacher`):
start, health, ``score`` and its tokenizer. Scoring is an engine call because the request and answer are each
engine's own (SGLang's ``/generate`` with input log-probs, vLLM's prompt log-probs, ``/v1/completions`` with
``echo``), while the connection around it (servers, retries, launch, fan-out) is the same as a rollout's.

Weights reach a server in one of three ways (``WeightPush.weight_sync``): a folder of safetensors the server reads
(``disk``), or `WeightBuckets` (an iterator of ``(name, tensor)`` buckets) sent as CUDA IPC handles (``tensor``) or
through a process group (``distributed``: its lifecycle, a session begun, the buckets sent, the session ended, a
restarted server given a new group, is the server layer's `group.DistributedPush`; an engine names its endpoints in
``group_endpoints`` and opens its group in ``open_group``). A LoRA policy may send its adapter alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar

from torch import Tensor

from .buckets import WeightBuckets
from .group import DistributedPush, GroupEndpoints, TransferGroup
from .http import HTTPClient
from .launch import Command
from .samples import Answer, Request, Scored
from .served import Served
from .settings import WeightPush
from .verify import Checksums


class ScoringEngine(ABC):
    """A server that scores given tokens; ``client`` talks to its servers (retries, the engine's errors)."""

    client_type: ClassVar[type[HTTPClient]]
    """The engine's client class (its error class names the engine)."""
    model_key: ClassVar[str]
    """The ``launch`` argument naming the checkpoint to serve (the policy's, when ``launch`` leaves it out)."""

    def __init__(self, client: HTTPClient):
        self.client = client

    @property
    def name(self) -> str:
        return self.client.error.engine

    @classmethod
    @abstractmethod
    def command(cls, launch: dict, python: str | None) -> Command:
        """How to start a server with ``launch`` (the rollout's ``launch`` argument) under ``python`` (the rollout's
        ``launch_python``; None: the engine's default)."""

    @abstractmethod
    def health(self, url: str) -> None:
        """Return once the server at ``url`` can generate; the engine's error otherwise."""

    @abstractmethod
    def score(
        self,
        url: str,
        prompt: list[int],
        continuation: list[int],
        images: list[str] | None,
        adapter: str | None,
        top_k: int = 0,
    ) -> Scored:
        """The server's log p(y_t | x, y_<t) of a given ``continuation`` of ``prompt`` (with its ``images``), with
        ``top_k`` its k most likely tokens at each position, and its weight version. Raw log-probs: log_softmax of
        the logits, no temperature (what every engine returns for given tokens)."""

    def model_path(self, url: str) -> str | None:
        """The checkpoint (or its tokenizer) the server at ``url`` says it serves, from OpenAI's ``GET /v1/models``
        (vLLM adds ``root``, the path it loaded); None when it names none."""
        answer = self.client.request(url, "/v1/models", method="GET", retries=0)
        models = answer.get("data") if isinstance(answer, dict) else None
        if not models:
            return None
        return models[0].get("root") or models[0].get("id")

    def tokenize(self, url: str, text: str) -> list[int]:
        """The server's token ids of ``text``, no special tokens added (``POST /tokenize``: vLLM and SGLang)."""
        answer = self.client.request(url, "/tokenize", {"prompt": text, "add_special_tokens": False}, retries=0)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            raise self.client.fail(url, f": /tokenize answered no tokens: {str(answer)[:300]}")
        return [int(t) for t in tokens]

    def close(self) -> None:
        """Tear down what the engine set up (weight-transfer groups); best effort, servers may be gone."""


def expert_fusions(under: str) -> dict[str, str]:
    """A mixture of experts' checkpoint tensors (one per expert and projection: Qwen3-MoE's and OLMoE's ``gate_proj``,
    ``up_proj``, ``down_proj``, Mixtral's ``w1``, ``w3``, ``w2``) to the two tensors an engine holds each layer's
    experts in: ``experts.<under>w13_weight`` (E, 2I, H), every expert's gate and up projections, and
    ``experts.<under>w2_weight`` (E, H, I), their down projections (SGLang's and vLLM's ``FusedMoE`` layers)."""
    w13, w2 = f"experts.{under}w13_weight", f"experts.{under}w2_weight"
    return {
        **{f"experts.*.{part}.weight": w13 for part in ("gate_proj", "up_proj", "w1", "w3")},
        **{f"experts.*.{part}.weight": w2 for part in ("down_proj", "w2")},
    }


class Engine(ScoringEngine):
    """One engine's mapping for a rollout: scoring, and sampling and weight pushes."""

    fusions: ClassVar[dict[str, str]] = {}
    """Tensors the engine fuses on load, the checkpoint's name -> the engine's: a module name part (``q_proj`` ->
    ``qkv_proj``), or the end of a name with ``*`` for an expert's index (``experts.*.down_proj.weight`` ->
    ``experts.w2_weight``, `expert_fusions`). A checksum of the fused tensor stands for each of its parts."""
    group_endpoints: ClassVar[GroupEndpoints]
    """The engine's endpoints of a ``distributed`` push (its lifecycle is the server layer's `DistributedPush`)."""

    def __init__(self, client: HTTPClient):
        super().__init__(client)
        self.distributed = DistributedPush(self, self.group_endpoints, self.open_group)

    def check_setup(self, url: str, push: WeightPush) -> None:
        """Refuse, in one line naming what is missing, a server started without what the rollout needs (for ``push``,
        its weight push; engines whose servers report their configuration override it)."""

    def served(self, url: str) -> Served:
        """What the server at ``url`` says it serves (its checkpoint, from ``/v1/models``; engines that say more
        override it)."""
        return Served(self.model_path(url))

    # ------------------------------------------------------------------ sampling
    @abstractmethod
    def generate(self, url: str, request: Request, adapter: str | None, keep_aborted: bool) -> list[Answer]:
        """``request.n`` answers, in order. A request the server aborted is sent again (`Retry`) unless
        ``keep_aborted``, which returns it with finish ``abort`` and the tokens sampled so far."""

    # ------------------------------------------------------------------ weights
    @abstractmethod
    def push_folder(self, urls: list[str], folder: str, version: int, abort: bool) -> None:
        """Every server loads the checkpoint in ``folder`` as ``version``. ``abort``: end the requests in flight first
        (partial rollouts continue them with the new weights); otherwise requests in flight finish on the old weights."""

    def push_buckets(
        self, urls: list[str], weights: WeightBuckets, version: int, push: WeightPush, abort: bool, device: str
    ) -> None:
        """Every server receives ``weights`` as ``version`` (``push.weight_sync``: tensor or distributed; the group's
        settings are ``push``'s); no request samples from a partly updated server. Every trainer rank calls it (rank 0
        sends, the others only gather); ``device``: where the policy is (``cuda``: NCCL). Through the engine's
        weight-transfer group (engines that take tensors another way override it)."""
        self.distributed.push(urls, weights, version, push, abort, device)

    @abstractmethod
    def open_group(self, urls: list[str], backend: str, push: WeightPush) -> TransferGroup:
        """A weight-transfer group of this process (rank 0) with ``urls``, over ``backend`` (nccl or gloo), at
        ``push``'s rendezvous (``master_address``, ``master_port``)."""

    @abstractmethod
    def load_adapter(
        self, urls: list[str], name: str, config: dict, tensors: dict[str, Tensor], push: WeightPush
    ) -> None:
        """Every server loads a LoRA adapter (peft's config and tensors) under ``name`` (an engine that loads adapters
        from a folder writes it under ``push.weight_dir``)."""

    @abstractmethod
    def unload_adapter(self, urls: list[str], name: str, push: WeightPush) -> None: ...

    @abstractmethod
    def checksums(self, url: str) -> Checksums:
        """{the server's tensor name: {rank: a digest of what that rank holds}}, from the engine's own weight checker:
        every tensor-parallel, pipeline and data-parallel rank of the server, each compared on its own (`verify`)."""

    @abstractmethod
    def pause(self, urls: list[str], abort: bool) -> None:
        """Stop generating: ``abort`` ends the requests in flight now (finish ``abort``, the tokens so far), otherwise
        the servers hold new requests once the ones in flight are answered."""

    @abstractmethod
    def resume(self, urls: list[str]) -> None: ...

    def each(self, urls: list[str], path: str, body: dict) -> None:
        """``POST path`` to every server in turn, one attempt each (a control request: pause, a weight-update
        session); an answer that refuses it raises (`refusal_check`)."""
        for url in urls:
            self.client.request(url, path, body, check=self.refusal_check(url), retries=0)

    def refusal_check(self, url: str) -> Callable[[Any], None] | None:
        """What raises on an answer of ``url`` that refuses a control request (None: the engine refuses with an HTTP
        error status)."""
        return None

    def flush_cache(self, urls: list[str]) -> None:
        """Forget cached KV of the old weights (engines whose updates do not)."""

    def release_memory(self, urls: list[str]) -> None:
        raise self.client.error(f"{self.name} rollout: release_memory is not supported by this engine")

    def resume_memory(self, urls: list[str]) -> None:
        raise self.client.error(f"{self.name} rollout: release_memory is not supported by this engine")

    def close(self) -> None:
        self.distributed.drop()
