"""The aggregator contract: the one place a per-token loss (B, R) becomes a scalar.

Each is written as  sum(loss * weights(mask)) / total,  where ``total`` adds up over
micro-batches and data-parallel ranks (``denominator``). The module sums ``denominator`` over
the whole mini-batch on every rank and passes it in, so a batch processed whole, in
micro-batches with accumulation, or split across ranks gives the same loss and gradient.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from torch import Tensor


class Aggregator(ABC):
    requires: frozenset[str] = frozenset()

    @abstractmethod
    def weights(self, mask: Tensor) -> Tensor:
        """Per-token weight before the global normalisation. Shape: (B, R)."""

    @abstractmethod
    def denominator(self, mask: Tensor) -> Tensor:
        """This shard's share of the normaliser (summable over shards). Shape: ()."""

    def __call__(self, per_token_loss: Tensor, mask: Tensor, total: Tensor | float | None = None) -> Tensor:
        """Scalar loss. ``total`` = the normaliser of the whole batch; None = this batch is the whole batch."""
        if per_token_loss.shape != mask.shape:
            raise ValueError(
                f"{type(self).__name__}: loss {tuple(per_token_loss.shape)} and mask {tuple(mask.shape)} differ"
            )
        mask = mask.float()
        if total is None:
            total = self.denominator(mask)
        numerator = (per_token_loss.float() * self.weights(mask)).sum()
        total = total.clamp_min(1.0) if isinstance(total, Tensor) else max(float(total), 1.0)
        return numerator / total
