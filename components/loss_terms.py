"""Extra per-token loss terms added to the surrogate before aggregation."""

from __future__ import annotations

from torch import Tensor

from lightning_rl.core import contracts
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.deprecation import moved
from lightning_rl.core.forward_outputs import PolicyForward

__getattr__ = moved(__name__, "lightning_rl.core.contracts.loss_term", ("LossTerm",))


class EntropyBonus(contracts.LossTerm):
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


class PositiveNLL(contracts.LossTerm):
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


__all__ = ["EntropyBonus", "PositiveNLL"]
# and on-policy distillation's components.distill.TeacherKL, a mixture of experts' components.moe.LoadBalancingLoss
