"""What the trainer pushed, as one digest per tensor, so a push knows which tensors it changed since the one before.

A digest is the sha256 of the tensor's bytes rounded to bfloat16 (floating-point tensors): the coarsest precision an
inference server holds unquantized weights in, so a change that a bf16 server cannot see is no change here, and a change
seen here is seen by a bf16, fp16 or fp32 server alike. A change finer than bf16 (a tiny step on a small tensor) is
left to the probe.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor


def digest(tensor: Tensor) -> str:
    """sha256 (hex, 16 digits) of ``tensor``'s bytes, floating-point values rounded to bfloat16 first."""
    t = tensor.detach()
    if t.is_floating_point():
        t = t.to(torch.bfloat16)
    data = t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(memoryview(data)).hexdigest()[:16]


class Fingerprints:
    """The digests of one push, by the name the server reads."""

    def __init__(self) -> None:
        self.digests: dict[str, str] = {}

    def add(self, named) -> None:
        for name, tensor in named:
            self.digests[name] = digest(tensor)

    def changed_since(self, previous: "Fingerprints | None") -> list[str] | None:
        """The names whose digest differs from ``previous`` (None when there is no previous push to compare with)."""
        if previous is None:
            return None
        return [name for name, d in self.digests.items() if previous.digests.get(name) != d]
