"""Extra per-token loss terms added to the surrogate before aggregation."""

from __future__ import annotations

from abc import ABC, abstractmethod

from torch import Tensor

from lightning_rl.batch import RolloutBatch


class LossTerm(ABC):
    """``__call__(logprobs, entropy, batch) -> (B, R)`` added to the per-token loss."""

    requires: frozenset[str] = frozenset()
    needs_entropy: bool = False

    @abstractmethod
    def __call__(self, logprobs: Tensor, entropy: Tensor | None, batch: RolloutBatch) -> Tensor:
        """Shape: (B, R)."""


class EntropyBonus(LossTerm):
    """-alpha * H(pi_theta(. | s_t)): rewards high entropy (Schulman et al. 2017, eq. 9).

    H is the full-vocabulary entropy of the tempered policy at each response position.
    """

    needs_entropy = True

    def __init__(self, coef: float = 0.001):
        """
        Args:
            coef: alpha, typically 1e-3 to 1e-2, or 0.
        """
        self.coef = coef

    def __call__(self, logprobs: Tensor, entropy: Tensor | None, batch: RolloutBatch) -> Tensor:
        return -self.coef * entropy
