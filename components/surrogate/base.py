"""What surrogates share beside their contract (`lightning_rl.core.contracts.Surrogate`): the importance ratio and the
trainer/sampler off-policy correction."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from lightning_rl.core import contracts
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.deprecation import moved
from lightning_rl.core.ops import masked_mean

__getattr__ = moved(__name__, "lightning_rl.core.contracts.surrogate", ("Surrogate",))

LOG_RATIO_CLAMP = 20.0
"""|log ratio| is clamped before exp so one numerical blip cannot produce an inf ratio."""


class OffPolicyCorrection(contracts.Correction):
    """Correct for the sampler's numerics differing from the trainer's (Yao et al. 2025, "Your efficient RL
    framework secretly brings you off-policy RL training").

    w = pi_old(trainer) / pi_rollout(sampler), from ``old_logprobs`` and ``rollout_logprobs``.
    ``mode="tis"``: weight min(w, cap) (truncated importance sampling).
    ``mode="mis"``: weight w * 1[lower <= w <= cap] (masked importance sampling): the kept tokens keep
    their importance weight, tokens (or whole sequences) outside the bounds get 0. At token level with a ``lower``
    bound this is IcePop's mask M(w; alpha, beta) = w on [alpha, beta], 0 outside (Ling Team 2025, "Every Step
    Evolves: Scaling Reinforcement Learning for Trillion-Scale Thinking Model", arXiv:2510.18855; alpha = 0.5,
    beta = 5 there), made for the mismatch of mixture-of-experts policies.
    ``mode="reject"``: weight 1[lower <= w <= cap], pure rejection: outliers dropped, the kept tokens
    uncorrected. ``level="sequence"`` uses the sequence weight exp(sum log w). The weight carries no gradient.
    ``level="geometric"`` (mis / reject): a sequence is kept or dropped whole by the geometric mean of its token
    ratios, whatever its length (Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
    Training-Inference Mismatch"):

        w_geo(y) = exp( 1/|y| sum_t log w_t )      keep(y) = 1[lower <= w_geo(y) <= cap]
        weight_t = w_t * keep(y)  (mis)            weight_t = keep(y)  (reject)
    """

    requires = frozenset({"old_logprobs", "rollout_logprobs"})

    def __init__(
        self,
        mode: Literal["tis", "mis", "reject"] = "tis",
        cap: float = 2.0,
        lower: float | None = None,
        level: Literal["token", "sequence", "geometric"] = "token",
    ):
        """
        Args:
            mode: tis (truncate w at ``cap``), mis (w, zeroed outside [lower, cap]) or reject (1, zeroed outside).
            cap: upper bound on w.
            lower: mis / reject: also zero w below this (None = no lower bound).
            level: token (per-token w), sequence (product over the sequence's valid tokens) or geometric (mis /
                reject: each sequence kept or dropped by the geometric mean of its token ratios).
        """
        if mode not in ("tis", "mis", "reject") or level not in ("token", "sequence", "geometric"):
            raise ValueError(
                "OffPolicyCorrection: mode must be tis|mis|reject and level token|sequence|geometric, got "
                f"{mode!r}, {level!r}"
            )
        if mode == "tis" and level == "geometric":
            raise ValueError(
                "OffPolicyCorrection: level geometric is a mask (mode mis or reject), not a truncation; use mode mis"
            )
        if cap <= 0:
            raise ValueError(f"OffPolicyCorrection: cap must be > 0, got {cap}")
        self.mode, self.cap, self.lower, self.level = mode, cap, lower, level

    def __call__(self, batch: RolloutBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """Detached per-token weights (B, R) and metrics."""
        mask = batch.loss_mask
        log_w = (batch.old_logprobs - batch.rollout_logprobs).float() * mask
        if self.level == "sequence":
            log_w = log_w.sum(-1, keepdim=True).expand_as(mask)
        w = log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
        if self.level == "geometric":  # (B, 1): the geometric mean of each sequence's token ratios
            geo = (log_w.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp_min(1)).exp()
            keep = ((geo <= self.cap) & (geo >= (self.lower if self.lower is not None else 0.0))).float()
            keep = keep.expand_as(mask)
            weight = w * keep if self.mode == "mis" else keep
            affected = 1.0 - keep
        elif self.mode == "tis":
            weight = w.clamp(max=self.cap)
            affected = (w > self.cap).float()
        else:
            keep = ((w <= self.cap) & (w >= (self.lower if self.lower is not None else 0.0))).float()
            weight = w * keep if self.mode == "mis" else keep
            affected = 1.0 - keep
        metrics = {
            "offpolicy/weight_mean": masked_mean(w, mask),
            "offpolicy/affected_frac": masked_mean(affected, mask),
        }
        return weight.detach(), {k: v.detach() for k, v in metrics.items()}


def token_log_ratio(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    """log pi_theta - log pi_old, clamped. Shape: (B, R)."""
    return (logprobs.float() - old_logprobs.float()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def ratio_metrics(ratio: Tensor, log_ratio: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """approx_kl is k3 of KL(pi_old || pi_theta) on the sampled tokens: (r - 1) - log r."""
    with torch.no_grad():
        big = torch.where(mask > 0, ratio, torch.zeros_like(ratio))
        return {
            "policy/approx_kl": masked_mean((ratio - 1) - log_ratio, mask),
            "policy/ratio_mean": masked_mean(ratio, mask),
            "policy/ratio_max": big.max() if big.numel() else ratio.new_zeros(()),
        }
