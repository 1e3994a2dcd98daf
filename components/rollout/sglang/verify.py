"""The verification probe against an SGLang server (the server layer's `probe` over `SGLangEngine`).

Why the exact check compares change, not the checksums themselves: SGLang's ``/weights_checker`` hashes the weights
as the server holds them (q/k/v and gate/up fused, tensor-parallel shards, the vocabulary padded, bf16), with a Triton
hash on GPUs; the trainer holds none of those tensors, so no hash it computes can match (`server.verify`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..server import probe
from ..server.probe import PROBE_TOKENS, Probe, probe_prompt, trainer_continuation, trainer_scores
from .client import SGLangClient, SGLangError
from .engine import SGLangEngine

__all__ = [
    "PROBE_TOKENS",
    "check",
    "probe_prompt",
    "server_continuation",
    "server_scores",
    "trainer_continuation",
    "trainer_scores",
]


def server_continuation(
    client: SGLangClient, url: str, prompt: list[int], lora_name: str | None
) -> tuple[list[int], Tensor, str | None]:
    """The server's greedy continuation of ``prompt``, its log-probs (shape (PROBE_TOKENS,)) and its weight version."""
    return probe.server_continuation(SGLangEngine(client), url, Probe(prompt), lora_name)


def server_scores(
    client: SGLangClient, url: str, prompt: list[int], continuation: list[int], lora_name: str | None
) -> tuple[Tensor, str | None]:
    """The server's log p(y_t | x, y_<t) of a given continuation (shape (PROBE_TOKENS,)) and its weight version."""
    scored = SGLangEngine(client).score(url, prompt, continuation, None, lora_name)
    return torch.tensor(scored.logprobs), scored.weight_version


def check(
    url: str, served: Tensor, expected: Tensor, served_version: str | None, version: str | None, tolerance: float
) -> None:
    """Raise `SGLangError` naming ``url`` when the server's probe log-probs or weight version are not the pushed ones."""
    probe.check_probe(SGLangError, url, served, expected, served_version, version, tolerance)
