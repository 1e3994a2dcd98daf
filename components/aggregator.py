"""Aggregators: the one place a per-token loss (B, R) becomes a scalar.

Each is written as  sum(loss * weights(mask)) / total,  where ``total`` adds up over
micro-batches and data-parallel ranks (``denominator``). The module sums ``denominator`` over
the whole mini-batch on every rank and passes it in, so a batch processed whole, in
micro-batches with accumulation, or split across ranks gives the same loss and gradient.
"""

from __future__ import annotations

from torch import Tensor

from lightning_rl.core import contracts
from lightning_rl.core.deprecation import moved

__getattr__ = moved(__name__, "lightning_rl.core.contracts.aggregator", ("Aggregator",))


def _sequence_count(mask: Tensor) -> Tensor:
    """Sequences with at least one valid token: a fully masked sample is not there."""
    return (mask.sum(-1) > 0).float().sum()


class TokenMean(contracts.Aggregator):
    """sum_i sum_t l_it / sum_i |o_i|: every token weighs the same (DAPO token-level loss, arXiv:2503.14476)."""

    def weights(self, mask: Tensor) -> Tensor:
        return mask

    def denominator(self, mask: Tensor) -> Tensor:
        return mask.sum()


class SeqMeanTokenMean(contracts.Aggregator):
    """(1/N) sum_i (1/|o_i|) sum_t l_it: every sequence weighs the same (original GRPO, arXiv:2402.03300 eq. 3)."""

    def weights(self, mask: Tensor) -> Tensor:
        return mask / mask.sum(-1, keepdim=True).clamp_min(1.0)

    def denominator(self, mask: Tensor) -> Tensor:
        return _sequence_count(mask)


class SeqMeanTokenSum(contracts.Aggregator):
    """(1/N) sum_i sum_t l_it: the sequence log-likelihood weighting of REINFORCE / RLOO (arXiv:2402.14740)."""

    def weights(self, mask: Tensor) -> Tensor:
        return mask

    def denominator(self, mask: Tensor) -> Tensor:
        return _sequence_count(mask)


class TokenSumNorm(contracts.Aggregator):
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


class TokenSum(contracts.Aggregator):
    """sum_i sum_t l_it: no normaliser, every token weighs 1 whatever the batch holds (the Tinker API's losses,
    ``loss = (per-token loss).sum()``; the learning rate then acts per token trained on). Exact over micro-batches;
    under data parallelism the ranks' gradients are averaged, so the update is the sum over the ranks' tokens divided
    by their number (a constant factor of the learning rate)."""

    def weights(self, mask: Tensor) -> Tensor:
        return mask

    def denominator(self, mask: Tensor) -> Tensor:
        return mask.new_ones(())  # the whole batch's normaliser is 1, however it is split into micro-batches
