"""The loss-term contract: an extra per-token term added to the surrogate before aggregation."""

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
    coef: float = 1.0
    """The term's weight; 0 puts no gradient on any token."""

    @abstractmethod
    def __call__(self, forward: PolicyForward, batch: RolloutBatch) -> Tensor:
        """Shape: (B, R)."""

    def gradient_tokens(self, batch: RolloutBatch) -> Tensor:
        """How many tokens that count this term puts a gradient on (0 = none: a batch whose advantages are all
        zero may then skip its update). Default: every token, unless the coefficient is 0. Shape: ()."""
        return batch.loss_mask.sum() * float(self.coef != 0)
