"""`CISPO`: clip the importance weight, not the update, so every token keeps its gradient."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Surrogate
from lightning_rl.core.ops import masked_mean

from .base import OffPolicyCorrection, ratio_metrics, token_log_ratio


class CISPO(Surrogate):
    """CISPO, clipped IS-weight policy optimization (MiniMax 2025, arXiv:2506.13585, eq. 4), per token:

        loss = -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi_theta,   r = pi_theta / pi_old

    The weight carries no gradient, so d loss / d log pi = -clip(r) A on every token: a token
    whose ratio left the range still pushes (with a capped weight), where PPO's clip zeroes its
    gradient. The paper sets no lower bound (``eps_low=None``) and tunes only ``eps_high``,
    whose value it does not report; 0.28 (DAPO's clip-higher) is our default. ``clipfrac``
    counts tokens whose weight was clipped, whatever the advantage's sign. The paper's token-mean
    normalisation is the aggregator's job (`TokenMean`).
    """

    def __init__(
        self, eps_low: float | None = None, eps_high: float = 0.28, correction: OffPolicyCorrection | None = None
    ):
        """
        Args:
            eps_low: weight >= 1 - eps_low; None = no lower bound (the paper's setting).
            eps_high: weight <= 1 + eps_high.
            correction: optional TIS/MIS correction for the sampler/trainer mismatch.
        """
        super().__init__(correction)
        if eps_high <= 0 or (eps_low is not None and not 0 < eps_low <= 1):
            raise ValueError(
                f"CISPO: need eps_high > 0 and eps_low in (0, 1] or None; got eps_low={eps_low}, eps_high={eps_high}"
            )
        self.eps_low, self.eps_high = eps_low, eps_high

    def per_token_loss(self, logprobs: Tensor, batch: RolloutBatch) -> tuple[Tensor, dict[str, Tensor]]:
        mask = batch.loss_mask  # (B, R)
        log_ratio = token_log_ratio(logprobs, batch.old_logprobs).detach()  # (B, R)
        ratio = log_ratio.exp()
        lower = 1.0 - self.eps_low if self.eps_low is not None else None
        weight = ratio.clamp(min=lower, max=1.0 + self.eps_high)  # no gradient: log_ratio is detached
        loss = -weight * batch.advantages.float() * logprobs.float()
        metrics = ratio_metrics(ratio, log_ratio, mask)
        with torch.no_grad():
            low = (ratio < lower).float() if lower is not None else torch.zeros_like(ratio)
            metrics["policy/clipfrac_low"] = masked_mean(low, mask)
            metrics["policy/clipfrac_high"] = masked_mean((ratio > 1.0 + self.eps_high).float(), mask)
            metrics["policy/clipfrac"] = metrics["policy/clipfrac_low"] + metrics["policy/clipfrac_high"]
        return loss, metrics
