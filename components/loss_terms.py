"""Extra per-token loss terms added to the surrogate before aggregation."""

from __future__ import annotations

from abc import ABC, abstractmethod

from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.forward_outputs import PolicyForward


class LossTerm(ABC):
    """``__call__(forward, batch) -> (B, R)`` added to the per-token loss. ``forward`` is the policy's forward on the
    micro-batch (`PolicyForward`): its log-probs, and what the term names in ``reads`` (``entropy`` with gradient,
    ``logits``: the whole distribution at each response position, ``router_logits``: a mixture-of-experts policy's
    routers); ``requires`` names the batch fields it reads."""

    requires: frozenset[str] = frozenset()
    reads: frozenset[str] = frozenset()

    @abstractmethod
    def __call__(self, forward: PolicyForward, batch: RolloutBatch) -> Tensor:
        """Shape: (B, R)."""

    def gradient_tokens(self, batch: RolloutBatch) -> Tensor:
        """How many tokens that count this term puts a gradient on (0 = none: a batch whose advantages are all
        zero may then skip its update). Default: every token, unless the coefficient is 0. Shape: ()."""
        return batch.loss_mask.sum() * float(getattr(self, "coef", 1.0) != 0)


class EntropyBonus(LossTerm):
    """-alpha * H(pi_theta(. | s_t)): rewards high entropy (Schulman et al. 2017, eq. 9).

    H is the full-vocabulary entropy of the tempered policy at each response position.
    """

    reads = frozenset({"entropy"})

    def __init__(self, coef: float = 0.001):
        """
        Args:
            coef: alpha, typically 1e-3 to 1e-2, or 0.
        """
        self.coef = coef

    def __call__(self, forward: PolicyForward, batch: RolloutBatch) -> Tensor:
        return -self.coef * forward.entropy


class PositiveNLL(LossTerm):
    """-mu * log pi_theta(a_t | s_t) on every token of a positive sample (score > threshold): VAPO's
    positive-example LM loss (Yue et al. 2025, arXiv:2504.05118; mu = 0.1 there).

    Departure: VAPO divides the NLL by the number of tokens of positive samples; here the term is
    reduced with the rest of the per-token loss by the configured aggregator (TokenMean: all tokens
    of the mini-batch), so the effective weight is mu times the fraction of positive tokens. The
    log-probs are those of the tempered policy (T = 1 in VAPO, where the two agree).
    """

    requires = frozenset({"scores"})

    def __init__(self, coef: float = 0.1, threshold: float = 0.0):
        """
        Args:
            coef: mu, the weight of the LM loss (VAPO: 0.1).
            threshold: a sample is positive when its score is above this (0.0 suits 0/1 and +-1 rewards).
        """
        self.coef, self.threshold = coef, threshold

    def __call__(self, forward: PolicyForward, batch: RolloutBatch) -> Tensor:
        positive = (batch.scores > self.threshold).float().unsqueeze(-1)  # (B, 1)
        return -self.coef * forward.logprobs.float() * positive

    def gradient_tokens(self, batch: RolloutBatch) -> Tensor:
        positive = (
            (batch.scores > self.threshold).float().unsqueeze(-1)
        )  # (B, 1): only positive samples have a gradient
        return (positive * batch.loss_mask).sum() * float(self.coef != 0)


__all__ = ["LossTerm", "EntropyBonus", "PositiveNLL"]
# and on-policy distillation's components.distill.TeacherKL, a mixture of experts' components.moe.LoadBalancingLoss
