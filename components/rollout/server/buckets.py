"""The policy's weights as they leave the trainer: an iterator of buckets of ``(name, full tensor)``, named and laid out
as the server's checkpoint files hold them (Hugging Face names, LoRA adapters folded in, a mixture of experts' 3-D
expert tensors as one tensor per expert and projection), of a bounded size, gathered one bucket at a time.

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

from .fingerprints import Fingerprints


@dataclass(frozen=True)
class Weight:
    name: str  # as the server names it: the checkpoint files' name
    key: str  # in policy.state_dict()
    shape: torch.Size  # full (unsharded), as the checkpoint holds it
    dtype: torch.dtype
    lora: tuple[str, str, float, bool] | None = (
        None  # keys of A and B, scaling, fan_in_fan_out: sent as W + scaling B A
    )
    converted: str | None = None  # the in-memory name whose conversion to the checkpoint's layout gives this tensor
    # (a mixture of experts' 3-D expert tensor: one of its experts' gate, up or down projection); None: sent as is

    @property
    def nbytes(self) -> int:
        return self.shape.numel() * self.dtype.itemsize


def plan_buckets(policy: nn.Module, bucket_bytes: int) -> list[list[Weight]]:
    """Every weight once (tied ones under their first name, as ``save_pretrained``), in ``state_dict`` order, in the
    checkpoint's layout, cut into buckets of at most ``bucket_bytes`` (a larger tensor is a bucket of its own; the
    checkpoint tensors of one in-memory tensor share a bucket)."""
    state = policy.state_dict(keep_vars=True)
    if any(hasattr(t, "ds_id") for t in state.values()):
        raise ValueError(
            "weights.weight_sync: distributed cannot gather DeepSpeed ZeRO-3 partitions; "
            "use configs/strategy/fsdp.yaml (FSDP2), ZeRO stage 2, or weights.weight_sync: disk"
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
    layout = checkpoint_layout(policy, {w.name: state[w.key] for w in weights})
    units = []  # the checkpoint tensors of each in-memory one
    for w in weights:
        parts = layout[w.name]
        if len(parts) == 1 and parts[0][0] == w.name:
            units.append([w])
            continue
        if w.lora is not None and len(parts) > 1:
            raise ValueError(
                f"cannot send {w.name} with its LoRA adapter folded in: its checkpoint splits it; use "
                "weights.weight_sync: disk"
            )
        units.append([replace(w, name=n, shape=shape, dtype=dtype, converted=w.name) for n, shape, dtype in parts])
    buckets: list[list[Weight]] = [[]]
    size = 0
    for unit in units:
        nbytes = sum(w.nbytes for w in unit)
        if buckets[-1] and size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].extend(unit)
        size += nbytes
    return [bucket for bucket in buckets if bucket]


def checkpoint_layout(
    policy: nn.Module, named: dict[str, Tensor]
) -> dict[str, list[tuple[str, torch.Size, torch.dtype]]]:
    """{name in memory: [(name, shape, dtype) of each tensor the checkpoint files hold for it]}, which a server's loader
    reads: transformers converts some weights on load and ``save_pretrained`` converts them back. A renaming (Qwen2-VL's
    ``model.layers`` is ``model.language_model.layers`` in memory) gives one tensor; a mixture of experts' 3-D expert
    tensor gives one per expert and projection (Qwen3-MoE's ``mlp.experts.gate_up_proj`` (E, 2I, H) is
    ``mlp.experts.<e>.gate_proj.weight`` and ``up_proj.weight``, (I, H) each). Read from the metadata alone."""
    from transformers.core_model_loading import revert_weight_conversion

    meta = {name: torch.empty(t.shape, dtype=t.dtype, device="meta") for name, t in named.items()}
    every = revert_weight_conversion(policy, dict(meta))
    if every.keys() == meta.keys():
        return {name: [(name, t.shape, t.dtype)] for name, t in meta.items()}
    layout = {}
    for name, t in meta.items():  # one at a time: which checkpoint tensors come from which in-memory one
        layout[name] = [(n, p.shape, p.dtype) for n, p in revert_weight_conversion(policy, {name: t}).items()]
    produced = {n: (shape, dtype) for parts in layout.values() for n, shape, dtype in parts}
    if produced != {n: (p.shape, p.dtype) for n, p in every.items()}:  # a conversion that merges tensors
        missing = sorted(set(every) ^ set(produced))[:3]
        raise ValueError(
            f"cannot name {missing} as {type(policy).__name__}'s checkpoint does; use weights.weight_sync: disk"
        )
    return layout


def checkpoint_tensors(policy: nn.Module, named: dict[str, Tensor]) -> list[tuple[str, Tensor]]:
    """``named`` (full tensors, named in memory) in the checkpoint's layout (`checkpoint_layout`)."""
    from transformers.core_model_loading import revert_weight_conversion

    return list(revert_weight_conversion(policy, dict(named)).items())


def _full(tensor: Tensor) -> Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor  # DTensor: all-gather (collective)


@torch.no_grad()
def gather(state: dict[str, Tensor], bucket: list[Weight], policy: nn.Module | None = None) -> list[Tensor]:
    """The bucket's full tensors, in its order, from ``policy.state_dict(keep_vars=True)`` (a collective under FSDP2:
    every rank calls it); a converted weight's in-memory tensor is gathered once and converted with ``policy``'s
    checkpoint conversion."""
    tensors = []
    converted: dict[str, dict[str, Tensor]] = {}
    for weight in bucket:
        if weight.converted is not None:
            if weight.key not in converted:
                full = {weight.converted: _full(state[weight.key]).detach()}
                converted[weight.key] = dict(checkpoint_tensors(policy, full))
            tensors.append(converted[weight.key][weight.name])
            continue
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
        self.policy = policy
        self.plan = plan_buckets(policy, bucket_bytes)
        self.state = policy.state_dict(keep_vars=True)
        self.fingerprints = fingerprints

    def __len__(self) -> int:
        return len(self.plan)

    def __iter__(self) -> Iterator[list[tuple[str, Tensor]]]:
        for bucket in self.plan:
            named = [(w.name, t) for w, t in zip(bucket, gather(self.state, bucket, self.policy))]
            if self.fingerprints is not None:
                self.fingerprints.add(named)
            yield named


def drain(buckets) -> None:
    """Take part in every gather of a push without sending (trainer ranks other than 0, or after a failure)."""
    for _ in buckets:
        pass
