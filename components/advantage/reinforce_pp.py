"""`ReinforcePlusPlus`: per-token reward-to-go (KL folded into the reward), whitened over the global batch."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import AdvantageEstimator, Advantages, Whiten
from lightning_rl.core.ops import group_view, reverse_scan, sequence_rewards, steps_first

from .base import reject_greedy_rows


def reward_to_go(rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """G_t = sum_{t' >= t} gamma^(t' - t) r_t' over valid tokens, in fp32; 0 on padding. Shape: (B, R) -> (B, R)."""
    r = rewards.float() * mask.float()
    if gamma == 1.0:
        returns = r.flip(-1).cumsum(-1).flip(-1)
    else:
        returns = reverse_scan(r, torch.full_like(r, gamma))
    return returns * mask.float()


class ReinforcePlusPlus(AdvantageEstimator):
    """REINFORCE++ (Hu et al. 2025, arXiv:2501.03262, eqs. 8-10):

        A_t = sum_{t' >= t} gamma^(t' - t) r_t',   r_t = 1[t = last] score - beta KL_t

    then z-scored over every token of the global batch (``whiten="global"`` by default).
    ``token_rewards`` already holds r_t: the module places the score on the last valid token
    and `KLRegularizer` with ``placement="reward"`` subtracts its per-token penalty, so the KL
    still to be paid from t on is each token's own. ``group_baseline=True`` is "REINFORCE++ w/
    baseline": the group mean of the sequence returns R_j (score minus the sequence's KL) is
    subtracted from every token's reward-to-go before whitening, so a group with identical
    returns is 0 before whitening.

    Departures: the paper's discount is 1 (``gamma`` is exposed); in the baseline variant the
    paper subtracts the group mean of the score and moves the KL into the loss, while here the
    group mean is taken over the returns, so KL placement stays the config's choice.
    """

    def __init__(
        self,
        gamma: float = 1.0,
        group_baseline: bool = False,
        whiten: Whiten = "global",
        shift_mean: bool = True,
        clip: float | None = None,
    ):
        """
        Args:
            gamma: discount of the reward-to-go (1 in the paper and in LLM practice).
            group_baseline: subtract the group mean of the sequence returns (REINFORCE++ w/ baseline).
            whiten: see `AdvantageEstimator`; global (all data-parallel ranks) in the paper.
            shift_mean: see `AdvantageEstimator`.
            clip: see `AdvantageEstimator`.
        """
        super().__init__(whiten, shift_mean, clip)
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"ReinforcePlusPlus: gamma must be in (0, 1], got {gamma}")
        self.gamma, self.group_baseline = gamma, group_baseline
        self.group_relative = group_baseline

    def estimate(self, batch: RolloutBatch) -> Advantages:
        reject_greedy_rows(batch, "ReinforcePlusPlus")
        mask = batch.action_tokens  # (B, R): a multi-turn transcript's observations are not steps
        if batch.action_mask is None:
            advantages = reward_to_go(batch.token_rewards, mask, self.gamma)  # (B, R)
        else:
            order = steps_first(mask)  # (B, R)
            steps = reward_to_go(batch.token_rewards.gather(-1, order), mask.gather(-1, order), self.gamma)
            advantages = torch.empty_like(steps).scatter_(-1, order, steps)
        if self.group_baseline:
            batch.require(["group_ids"], "ReinforcePlusPlus(group_baseline=True)")
            grouped = group_view(sequence_rewards(batch), batch.group_ids)  # (n_groups, G)
            # the mean measured from the group's first return: exact when all returns are equal
            first = grouped[:, :1]
            baseline = (first + (grouped - first).mean(-1, keepdim=True)).expand_as(grouped).reshape(-1)  # (B,)
            advantages = (advantages - baseline.unsqueeze(-1)) * mask
        return Advantages(advantages, None)
