"""`StableReinforce`: PPO's clipped objective with the log-ratio clipped before exp and outlier advantages dropped."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Surrogate
from lightning_rl.core.ops import masked_mean

from .base import OffPolicyCorrection, ratio_metrics


class StableReinforce(Surrogate):
    """StableReinforce (Zhang et al. 2025, R1-Reward, arXiv:2505.02835, section 3.2), per token:

        d = clip(log pi_theta - log q, -b, b)                      (Pre-CLIP)
        r = exp(d)
        keep = 1[|A - mean(A)| <= k std(A)]                        (Advantage Filter, the 3-sigma rule for k = 3)
        loss = -keep min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) + kl_coeff ((1 / r - 1) + d)

    Pre-CLIP bounds the log-ratio before the exponential, so a token whose probability collapsed (log pi - log q far
    below 0 with A < 0, where PPO's clip does not bind) cannot blow the loss up; outside [-b, b] the token has no
    gradient. The filter's mean and standard deviation are taken over the batch's loss tokens, detached. The last term
    is GRPO's k3 estimate of KL(pi_theta || q), q / pi - 1 - log(q / pi) (arXiv:2402.03300 eq. 4 with q in the
    reference's place), off when ``kl_coeff = 0``.
    Departures from the paper: b is a free parameter (the paper writes the bound as a hyper-parameter without a value
    we could use), the filter runs on tokens rather than on whole responses (identical when each response's tokens
    share its advantage), and the KL term is the Tinker API's ``kl_coeff`` of its ``stable_reinforce`` loss, which the
    paper does not have.
    """

    def __init__(
        self,
        eps_low: float = 0.2,
        eps_high: float = 0.2,
        pre_clip: float = 2.0,
        filter_sigmas: float = 3.0,
        kl_coeff: float = 0.0,
        correction: OffPolicyCorrection | None = None,
    ):
        """
        Args:
            eps_low: lower clip range of the ratio, r >= 1 - eps_low.
            eps_high: upper clip range of the ratio, r <= 1 + eps_high.
            pre_clip: b, the bound on |log pi_theta - log q| before exp.
            filter_sigmas: k, tokens whose advantage is more than k standard deviations from the mean are dropped.
            kl_coeff: weight of the k3 estimate of KL(pi_theta || q) (0 = off).
            correction: optional TIS/MIS correction for the sampler/trainer mismatch.
        """
        super().__init__(correction)
        if not (0 < eps_low < 1 and eps_high > 0 and pre_clip > 0 and filter_sigmas > 0 and kl_coeff >= 0):
            raise ValueError(
                "StableReinforce: need 0 < eps_low < 1, eps_high > 0, pre_clip > 0, filter_sigmas > 0 and kl_coeff >= 0; "
                f"got {eps_low}, {eps_high}, {pre_clip}, {filter_sigmas}, {kl_coeff}"
            )
        self.eps_low, self.eps_high, self.pre_clip = eps_low, eps_high, pre_clip
        self.filter_sigmas, self.kl_coeff = filter_sigmas, kl_coeff

    def per_token_loss(self, logprobs: Tensor, batch: RolloutBatch) -> tuple[Tensor, dict[str, Tensor]]:
        mask = batch.loss_mask  # (B, R)
        advantages = batch.advantages.float()
        log_ratio = (logprobs.float() - batch.old_logprobs.float()).clamp(-self.pre_clip, self.pre_clip)  # (B, R)
        ratio = log_ratio.exp()
        with torch.no_grad():
            mean = masked_mean(advantages, mask)
            std = masked_mean((advantages - mean).square(), mask).sqrt()
            keep = ((advantages - mean).abs() <= self.filter_sigmas * std).float()  # (B, R)
        clipped = ratio.clamp(1.0 - self.eps_low, 1.0 + self.eps_high)
        loss = -keep * torch.minimum(ratio * advantages, clipped * advantages)
        if self.kl_coeff > 0:
            loss = loss + self.kl_coeff * ((-log_ratio).exp() - 1.0 + log_ratio)
        metrics = ratio_metrics(ratio.detach(), log_ratio.detach(), mask)
        with torch.no_grad():
            metrics["policy/filtered_frac"] = masked_mean(1.0 - keep, mask)
            metrics["policy/pre_clipped_frac"] = masked_mean(
                ((logprobs.float() - batch.old_logprobs.float()).abs() > self.pre_clip).float(), mask
            )
        return loss, metrics
