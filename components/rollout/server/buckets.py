"""The policy's weights as they leave the trainer: an iterator of buckets of ``(name, full tensor)``, named as the
server's checkpoint files name them (Hugging Face names, LoRA adapters folded in), of a bounded size, gathered one
bucket at a time.

Buckets are planned from metadata alone (names, global shapes, dtypes), so a request can carry its bucket's names,
dtypes and shapes before any data moves. Under FSDP2 each parameter is a DTensor shard: `gather` all-gathers one
bucket's full tensors (a collective: every trainer rank iterates, in the same order), so at most a bucket or two of
full tensors exist at a time, never the whole model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator

import torch
from torch import Tensor, nn

from lightning_rl.core.lora import ADAPTER, is_lora, lora_layers, merged_weight
from lightning_rl.core.models import is_vision_language

from .fingerprints import Fingerprints


@dataclass(frozen=True)
class Weight:
    name: str  # as the server names it
    key: str  # in policy.state_dict()
    shape: torch.Size  # full (unsharded)
    dtype: torch.dtype
    lora: tuple[str, str, float, bool] | None = (
        None  # keys of A and B, scaling, fan_in_fan_out: sent as W + scaling B A
    )

    @property
    def nbytes(self) -> int:
        return self.shape.numel() * self.dtype.itemsize


def plan_buckets(policy: nn.Module, bucket_bytes: int) -> list[list[Weight]]:
    """Every weight once (tied ones under their first name, as ``save_pretrained``), in ``state_dict`` order, cut into
    buckets of at most ``bucket_bytes`` (a larger tensor is a bucket of its own)."""
    state = policy.state_dict(keep_vars=True)
    if any(hasattr(t, "ds_id") for t in state.values()):
        raise ValueError(
            "weight_sync: distributed cannot gather DeepSpeed ZeRO-3 partitions; "
            "use configs/strategy/fsdp.yaml (FSDP2), ZeRO stage 2, or weight_sync: disk"
        )
    adapters = lora_layers(policy) if is_lora(policy) else {}
    seen: set[int] = set()
    weights = []
    for key, tensor in state.items():
        if ".lora_" in key or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        name = key.replace(".base_layer.", ".")
        layer = name.rsplit(".", 1)[0]
        lora = None
        if key.endswith(".base_layer.weight") and layer in adapters:
            lora = (f"{layer}.lora_A.{ADAPTER}.weight", f"{layer}.lora_B.{ADAPTER}.weight", *adapters[layer])
        weights.append(Weight(name, key, tensor.shape, tensor.dtype, lora))
    names = checkpoint_names(policy, {w.name: state[w.key] for w in weights})
    weights = [replace(w, name=names[w.name]) for w in weights]
    buckets: list[list[Weight]] = [[]]
    size = 0
    for weight in weights:
        if buckets[-1] and size + weight.nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(weight)
        size += weight.nbytes
    return [bucket for bucket in buckets if bucket]


def checkpoint_names(policy: nn.Module, named: dict[str, Tensor]) -> dict[str, str]:
    """{name in memory: name in the checkpoint files}, which a server's loader reads. transformers renames some weights
    of vision-language models on load (Qwen2-VL's ``model.layers`` is ``model.language_model.layers`` in memory);
    ``save_pretrained`` names them back, and so does this."""
    if not is_vision_language(getattr(policy, "config", None)):
        return {name: name for name in named}
    from transformers.core_model_loading import revert_weight_conversion

    by_tensor = {id(t): name for name, t in named.items()}
    names = {
        by_tensor[id(t)]: saved
        for saved, t in revert_weight_conversion(policy, dict(named)).items()
        if id(t) in by_tensor
    }
    if len(names) != len(named):  # a conversion that fuses or splits tensors, not a renaming
        missing = sorted(set(named) - set(names))[:3]
        raise ValueError(f"cannot name {missing} as {type(policy).__name__}'s checkpoint does; use weight_sync: disk")
    return names


def _full(tensor: Tensor) -> Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor  # DTensor: all-gather (collective)


@torch.no_grad()
def gather(state: dict[str, Tensor], bucket: list[Weight]) -> list[Tensor]:
    """The bucket's full tensors, in its order, from ``policy.state_dict(keep_vars=True)`` (a collective under FSDP2:
    every rank calls it)."""
    tensors = []
    for weight in bucket:
        full = _full(state[weight.key]).detach()
        if weight.lora is not None:
            a_key, b_key, scaling, fan_in_fan_out = weight.lora
            full = merged_weight(
                full, _full(state[a_key]).detach(), _full(state[b_key]).detach(), scaling, fan_in_fan_out
            )
        tensors.append(full)
    return tensors


class WeightBuckets:
    """The policy's weights as an iterator of buckets of ``(name, full tensor)``; ``plan`` is every bucket's metadata,
    known before any data moves. ``fingerprints`` (rank 0) records each tensor's digest as it passes."""

    def __init__(self, policy: nn.Module, bucket_bytes: int, fingerprints: Fingerprints | None = None):
        self.plan = plan_buckets(policy, bucket_bytes)
        self.state = policy.state_dict(keep_vars=True)
        self.fingerprints = fingerprints

    def __len__(self) -> int:
        return len(self.plan)

    def __iter__(self) -> Iterator[list[tuple[str, Tensor]]]:
        for bucket in self.plan:
            named = [(w.name, t) for w, t in zip(bucket, gather(self.state, bucket))]
            if self.fingerprints is not None:
                self.fingerprints.add(named)
            yield named


def drain(buckets) -> None:
    """Take part in every gather of a push without sending (trainer ranks other than 0, or after a failure)."""
    for _ in buckets:
        pass
