"""The pretraining-loss contract: a language-modelling loss on text mixed into the policy loss
(`components.ptx.PretrainMix`, PPO-ptx)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from torch import Tensor, nn


class PretrainLoss(ABC):
    """``loss(policy, text_ids, text_mask)``: the weighted loss on one batch of left-padded text (N, L) under the policy,
    with gradient, and its detached metrics; added to the policy loss at every optimizer step."""

    requires: frozenset[str] = frozenset()

    @abstractmethod
    def loss(self, policy: nn.Module, text_ids: Tensor, text_mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """A scalar loss and detached metrics."""
