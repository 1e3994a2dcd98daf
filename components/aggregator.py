"""Aggregators: the one place a per-token loss (B, R) becomes a scalar.

Each is written as  sum(loss * weights(mask)) / total,  where ``total`` adds up over
micro-batches and data-parallel ranks (``denominator``). The module sums ``denominator`` over
the whole mini-batch on every rank and passes it in, so a batch processed whole, in
micro-batches with accumulation, or split across ranks gives the same loss and gradient.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from torch import Tensor


class Aggregator(ABC):
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


def _sequence_count(mask: Tensor) -> Tensor:
    """Sequences with at least one valid token: a fully masked sample is not there."""
    return (mask.sum(-1) > 0).float().sum()


class TokenMean(Aggregator):
    """sum_i sum_t l_it / sum_i |o_i|: every token weighs the same (DAPO token-level loss, arXiv:2503.14476)."""

    def weights(self, mask: Tensor) -> Tensor:
        return mask

    def denominator(self, mask: Tensor) -> Tensor:
        return mask.sum()


class SeqMeanTokenMean(Aggregator):
    """(1/N) sum_i (1/|o_i|) sum_t l_it: every sequence weighs the same (original GRPO, arXiv:2402.03300 eq. 3)."""

    def weights(self, mask: Tensor) -> Tensor:
        return mask / mask.sum(-1, keepdim=True).clamp_min(1.0)

    def denominator(self, mask: Tensor) -> Tensor:
        return _sequence_count(mask)


class SeqMeanTokenSum(Aggregator):
    """(1/N) sum_i sum_t l_it: the sequence log-likelihood weighting of REINFORCE / RLOO (arXiv:2402.14740)."""

    def weights(self, mask: Tensor) -> Tensor:
        return mask

    def denominator(self, mask: Tensor) -> Tensor:
        return _sequence_count(mask)


class TokenSumNorm(Aggregator):
    """(1/N) sum_i sum_t l_it / C with a constant C (e.g. max_new_tokens): Dr. GRPO's length-independent
    denominator (Liu et al. 2025, arXiv:2503.20783)."""

    def __init__(self, constant: float = 1024.0):
        """
        Args:
            constant: C, the fixed per-sequence normaliser (Dr. GRPO uses the generation budget).
        """
        if constant <= 0:
            raise ValueError(f"TokenSumNorm: constant must be > 0, got {constant}")
        self.constant = constant

    def weights(self, mask: Tensor) -> Tensor:
        return mask / self.constant

    def denominator(self, mask: Tensor) -> Tensor:
        return _sequence_count(mask)


class TokenSum(Aggregator):
    """sum_i sum_t l_it: no normaliser, every token weighs 1 whatever the batch holds (the Tinker API's losses,
    ``loss = (per-token loss).sum()``; the learning rate then acts per token trained on). Exact over micro-batches;
    under data parallelism the ranks' gradients are averaged, so the update is the sum over the ranks' tokens divided
    by their number (a constant factor of the learning rate)."""

    def weights(self, mask: Tensor) -> Tensor:
        return mask

    def denominator(self, mask: Tensor) -> Tensor:
        return mask.new_ones(())  # the whole batch's normaliser is 1, however it is split into micro-batches
