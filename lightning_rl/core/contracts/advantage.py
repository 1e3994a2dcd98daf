"""The advantage-estimator contract (`AdvantageEstimator`) and the whitening every estimator offers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal, NamedTuple

from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.ops import masked_whiten

Whiten = Literal["none", "batch", "global"]


class Advantages(NamedTuple):
    advantages: Tensor  # (B, R), 0 on masked tokens
    returns: Tensor | None  # (B, R) value targets, or None without a critic


class AdvantageEstimator(ABC):
    """Turns rewards (and values) into per-token advantages.

    Whitening (z-scoring over the tokens that count in the loss, fp32) is applied after
    ``estimate``: ``batch`` uses this rank's tokens, ``global`` all data-parallel ranks' tokens.
    Returns are computed before whitening, so value targets never see it. ``clip`` then bounds every
    advantage to [-clip, clip] (after whitening, so the bound is in the units the surrogate sees): one
    outlier reward or value error cannot dominate a mini-batch's gradient.
    """

    requires: frozenset[str] = frozenset({"token_rewards"})
    group_relative: bool = False
    produces_returns: bool = False
    """Fills ``returns`` (value targets) for a critic (GAE)."""
    """Compares each response with the others of its prompt's group (a group of 1 gives A = 0: checked at construction)."""

    def __init__(self, whiten: Whiten = "none", shift_mean: bool = True, clip: float | None = None):
        """
        Args:
            whiten: none / batch / global (across data-parallel ranks) z-scoring of the advantages.
            shift_mean: with whitening, also remove the mean (False rescales only, keeping any baseline).
            clip: bound |A| by this after whitening (None = no bound).
        """
        if clip is not None and not clip > 0:
            raise ValueError(f"{type(self).__name__}: clip must be > 0 (or None), got {clip}")
        self.clip = clip
        if whiten not in ("none", "batch", "global"):
            raise ValueError(f"{type(self).__name__}: whiten must be none, batch or global, got {whiten!r}")
        self.whiten = whiten
        self.shift_mean = shift_mean

    @abstractmethod
    def estimate(self, batch: RolloutBatch) -> Advantages:
        """Raw advantages and returns before whitening."""

    def __call__(self, batch: RolloutBatch) -> Advantages:
        batch.require(self.requires, type(self).__name__)
        advantages, returns = self.estimate(batch)
        if self.whiten != "none":
            advantages = masked_whiten(
                advantages, batch.loss_mask, self.shift_mean, global_stats=self.whiten == "global"
            )
        if self.clip is not None:
            advantages = advantages.clamp(-self.clip, self.clip)
        return Advantages(advantages, returns)
