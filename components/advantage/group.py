"""Critic-free baseline from a group of samples of the same prompt: GRPO / Dr. GRPO."""

from __future__ import annotations

from typing import Literal

import torch

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import AdvantageEstimator, Advantages, Whiten
from lightning_rl.core.ops import broadcast_to_tokens, group_view, sequence_rewards

from .base import reject_greedy_rows


class GroupNormalized(AdvantageEstimator):
    """Group-relative advantage, GRPO (Shao et al. 2024, arXiv:2402.03300, eq. 3) and Dr. GRPO.

        A_i = (R_i - mean_g(R)) / (std + eps)    scale="group"  (GRPO)
        A_i = (R_i - mean_g(R)) / (std_batch + eps)  scale="batch"
        A_i =  R_i - mean_g(R)                   scale="none"   (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783)

    broadcast to every token of sample i. ``std`` is the population std (divisor G) by default, as
    in GRPO's worked examples; ``bessel=True`` takes the sample std (divisor G - 1, torch's
    default), which makes |A| smaller by sqrt((G - 1) / G). A group with identical rewards gets
    A = 0 exactly (never 0/0). R_i is the sequence return: the score minus any KL-in-reward.
    """

    group_relative = True

    def __init__(
        self,
        scale: Literal["group", "batch", "none"] = "group",
        bessel: bool = False,
        eps: float = 1e-6,
        whiten: Whiten = "none",
        shift_mean: bool = True,
        clip: float | None = None,
    ):
        """
        Args:
            scale: divide by the group's std (GRPO), the whole batch's std, or nothing (Dr. GRPO).
            bessel: use the sample std (divisor G - 1) instead of the population std (divisor G).
            eps: added to the std.
            whiten: see `AdvantageEstimator`.
            shift_mean: see `AdvantageEstimator`.
            clip: see `AdvantageEstimator`.
        """
        super().__init__(whiten, shift_mean, clip)
        if scale not in ("group", "batch", "none"):
            raise ValueError(f"GroupNormalized: scale must be group, batch or none, got {scale!r}")
        self.scale, self.bessel, self.eps = scale, bessel, eps

    def estimate(self, batch: RolloutBatch) -> Advantages:
        batch.require(["group_ids"], "GroupNormalized")
        reject_greedy_rows(batch, "GroupNormalized")
        rewards = sequence_rewards(batch)  # (B,)
        grouped = group_view(rewards, batch.group_ids)  # (n_groups, G)
        # shift by the group's first reward before averaging: a group of identical non-dyadic rewards
        # (0.7 x 7) then centres to exactly 0, where the float mean would leave ~1e-8 for the std to blow up
        offsets = grouped - grouped[:, :1]
        centered = offsets - offsets.mean(-1, keepdim=True)
        correction = 1 if self.bessel else 0
        if self.scale == "group":
            std = (
                offsets.std(-1, keepdim=True, correction=correction)
                if grouped.shape[1] > correction
                else torch.zeros_like(offsets[:, :1])
            )
            centered = centered / (std + self.eps)
        elif self.scale == "batch":
            std = rewards.std(correction=correction) if rewards.numel() > correction else torch.zeros(())
            centered = centered / (std + self.eps)
        return Advantages(broadcast_to_tokens(centered.reshape(-1), batch.action_tokens), None)
