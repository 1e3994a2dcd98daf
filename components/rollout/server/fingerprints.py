"""What the trainer pushed, as one digest per tensor, so a push knows which tensors it changed since the one before.

A digest is the sha256 of the tensor's bytes rounded to bfloat16 (floating-point tensors), the coarsest precision an
inference server holds unquantized weights in. What holds, by the server's dtype:

* bf16: the digest changes exactly when the server's copy does (the same round-to-nearest-even of the same values).
* fp32: a change seen here is a change of the values, so the server's copy changes too; a change finer than bf16
  (a tiny step on a small tensor) is not seen here and is left to the probe.
* fp16: a change seen here is usually seen there too, but not always. fp16 rounds at other boundaries (1 + 2^-8 + 1e-5
  and 1 + 2^-8 - 1e-5 are two bf16 values, 1 + 2^-7 and 1, but one fp16 value, 1 + 2^-8) and flushes magnitudes below
  2^-25 to zero, so a tensor whose every change is that small reads as not loaded there: a false alarm, never a miss.
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
