"""`CovariancePG`: Clip-Cov and KL-Cov, the entropy-mechanism controls of Cui et al. 2025 (arXiv:2505.22617)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Surrogate
from lightning_rl.core.ops import masked_mean

from .base import OffPolicyCorrection, ratio_metrics, token_log_ratio


class CovariancePG(Surrogate):
    """Policy gradient with the few tokens that drive entropy collapse held back (Cui et al. 2025, sec. 4).

    Entropy falls in proportion to the covariance between a token's log-prob and its advantage; a small
    set of tokens with the largest covariance carries most of it. Per valid token t of the micro-batch:

        Cov_t = (log pi(y_t) - mean_s log pi(y_s)) * (A_t - mean_s A_s)      (detached, means over its tokens)
        base:     loss_t = -r_t A_t,   r_t = pi_theta / pi_old
        clip_cov: tokens with w_low <= Cov_t <= w_high, ``ratio`` x N of them drawn at random (at least 1),
                  lose their gradient: r_t A_t keeps its value, detached             (eq. 9; r 2e-4, w 1..5)
                  (the paper writes 0 for their term: the same gradient, but the loss logged here still counts them)
        kl_cov:   the ``ratio`` x N tokens of largest Cov_t (at least 1) add beta |log pi_theta - log pi_old|
                                                                                     (eq. 10; k 2e-3, beta 1)

    The random draw of clip_cov uses torch's global generator, which the trainer seeds per iteration.
    KL-Cov's penalty (logged as ``policy/cov_penalty``, its token mean) is 0, with its gradient, where pi_theta = pi_old:
    on the first mini-batch of an iteration, and on every one of an on-policy loop (one epoch, one mini-batch).
    """

    def __init__(
        self,
        mode: Literal["clip_cov", "kl_cov"] = "kl_cov",
        ratio: float = 2e-3,
        cov_low: float = 1.0,
        cov_high: float = 5.0,
        beta: float = 1.0,
        correction: OffPolicyCorrection | None = None,
    ):
        """
        Args:
            mode: clip_cov (detach a random few high-covariance tokens) or kl_cov (KL penalty on the top few).
            ratio: the fraction of valid tokens acted on (clip_cov: r, the paper 2e-4; kl_cov: k, 2e-3).
            cov_low: clip_cov: lower bound of the covariance band tokens are drawn from.
            cov_high: clip_cov: upper bound of that band.
            beta: kl_cov: the penalty's coefficient.
            correction: optional TIS/MIS correction for the sampler/trainer mismatch.
        """
        super().__init__(correction)
        if mode not in ("clip_cov", "kl_cov"):
            raise ValueError(f"CovariancePG: mode must be clip_cov or kl_cov, got {mode!r}")
        if not 0 < ratio <= 1 or cov_low > cov_high or beta < 0:
            raise ValueError(
                f"CovariancePG: need 0 < ratio <= 1, cov_low <= cov_high, beta >= 0; got {ratio}, {cov_low}, {cov_high}, {beta}"
            )
        self.mode, self.ratio, self.cov_low, self.cov_high, self.beta = mode, ratio, cov_low, cov_high, beta

    @property
    def inert_on_policy(self) -> str | None:
        return (
            "its KL-Cov penalty beta |log pi_theta - log pi_old|" if self.mode == "kl_cov" and self.beta > 0 else None
        )

    def covariance(self, logprobs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
        """Cov_t over the valid tokens, 0 elsewhere. Shape: (B, R)."""
        lp, adv = logprobs.detach().float(), advantages.float()
        return (lp - masked_mean(lp, mask)) * (adv - masked_mean(adv, mask)) * mask

    def per_token_loss(self, logprobs: Tensor, batch: RolloutBatch) -> tuple[Tensor, dict[str, Tensor]]:
        mask = batch.loss_mask  # (B, R)
        advantages = batch.advantages.float()
        log_ratio = token_log_ratio(logprobs, batch.old_logprobs)  # (B, R)
        ratio = log_ratio.exp()
        cov = self.covariance(logprobs, advantages, mask).flatten()  # (B*R,)
        valid = mask.flatten() > 0
        n = max(1, int(self.ratio * int(valid.sum())))
        chosen = torch.zeros_like(cov, dtype=torch.bool)
        if self.mode == "clip_cov":
            band = torch.nonzero(valid & (cov >= self.cov_low) & (cov <= self.cov_high)).flatten()
            if band.numel():
                chosen[band[torch.randperm(band.numel(), device="cpu")[:n].to(band.device)]] = True
        elif bool(valid.any()):
            chosen[torch.topk(cov.masked_fill(~valid, float("-inf")), min(n, int(valid.sum()))).indices] = True
        chosen = chosen.view_as(mask)  # (B, R)
        objective = ratio * advantages
        if self.mode == "clip_cov":
            loss = -torch.where(chosen, objective.detach(), objective)
        else:
            penalty = self.beta * chosen.float() * log_ratio.abs()  # (B, R)
            loss = -objective + penalty
        metrics = ratio_metrics(ratio.detach(), log_ratio.detach(), mask)
        if self.mode == "kl_cov":
            metrics["policy/cov_penalty"] = masked_mean(penalty.detach(), mask)
        metrics["policy/cov_selected_frac"] = masked_mean(chosen.float(), mask)
        metrics["policy/cov_mean"] = masked_mean(cov.view_as(mask), mask)
        return loss, metrics
