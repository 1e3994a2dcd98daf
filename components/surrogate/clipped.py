"""`ClippedSurrogate`: PPO's clipped objective with clip-higher, dual clip and GSPO's sequence-level ratio."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Surrogate
from lightning_rl.core.ops import masked_mean

from .base import LOG_RATIO_CLAMP, OffPolicyCorrection, ratio_metrics, token_log_ratio


class ClippedSurrogate(Surrogate):
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347, eq. 7), per token:

        loss = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)

    * ``eps_high > eps_low`` is DAPO's clip-higher (Yu et al. 2025, arXiv:2503.14476).
    * ``dual_clip = c`` floors the objective at c A when A < 0 (Ye et al. 2020, arXiv:1912.09729).
    * ``level="sequence"`` is GSPO (Zheng et al. 2025, arXiv:2507.18071, eq. 7): one ratio per
      sequence, s_i = exp(mean_t log r_it), the geometric mean of its token ratios, clipped per
      sequence and applied to every token of it (pair it with ``SeqMeanTokenMean`` for GSPO's
      1/G sum over sequences). Its gradient flows to each token through the mean.
    """

    def __init__(
        self,
        eps_low: float = 0.2,
        eps_high: float = 0.2,
        dual_clip: float | None = None,
        level: Literal["token", "sequence"] = "token",
        correction: OffPolicyCorrection | None = None,
    ):
        """
        Args:
            eps_low: lower clip range, ratio >= 1 - eps_low.
            eps_high: upper clip range, ratio <= 1 + eps_high (> eps_low = clip-higher).
            dual_clip: c > 1 for dual-clip PPO on negative advantages; None = off.
            level: token (PPO/GRPO) or sequence (GSPO) importance ratio.
            correction: optional TIS/MIS correction for the sampler/trainer mismatch.
        """
        super().__init__(correction)
        if dual_clip is not None and dual_clip <= 1.0:
            raise ValueError(f"ClippedSurrogate: dual_clip must be > 1 (e.g. 3), got {dual_clip}")
        if level not in ("token", "sequence"):
            raise ValueError(f"ClippedSurrogate: level must be token or sequence, got {level!r}")
        self.eps_low, self.eps_high, self.dual_clip, self.level = eps_low, eps_high, dual_clip, level

    def per_token_loss(self, logprobs: Tensor, batch: RolloutBatch) -> tuple[Tensor, dict[str, Tensor]]:
        mask = batch.loss_mask  # (B, R)
        advantages = batch.advantages.float()
        log_ratio = token_log_ratio(logprobs, batch.old_logprobs)  # (B, R)
        if self.level == "sequence":
            seq_log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)  # (B,)
            log_ratio = seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).unsqueeze(-1).expand_as(mask)
        ratio = log_ratio.exp()
        clipped_ratio = ratio.clamp(1.0 - self.eps_low, 1.0 + self.eps_high)
        objective = torch.minimum(ratio * advantages, clipped_ratio * advantages)
        if self.dual_clip is not None:
            objective = torch.where(advantages < 0, torch.maximum(objective, self.dual_clip * advantages), objective)
        metrics = ratio_metrics(ratio.detach(), log_ratio.detach(), mask)
        with torch.no_grad():
            low = ((ratio < 1.0 - self.eps_low) & (advantages < 0)).float()
            high = ((ratio > 1.0 + self.eps_high) & (advantages > 0)).float()
            metrics["policy/clipfrac_low"] = masked_mean(low, mask)
            metrics["policy/clipfrac_high"] = masked_mean(high, mask)
            metrics["policy/clipfrac"] = metrics["policy/clipfrac_low"] + metrics["policy/clipfrac_high"]
        return -objective, metrics
