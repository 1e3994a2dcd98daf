"""`KLRegularizer`: the leash to the reference policy, in the reward or in the loss, fixed or adaptive.

Estimators on the sampled token, with log rho = log pi_ref - log pi (Schulman, "Approximating KL
Divergence", 2020):  k1 = -log rho,  k2 = (log rho)^2 / 2,  k3 = (rho - 1) - log rho.

What each optimises when differentiated in the loss (on-policy, per token): grad k1 has zero
expectation, grad k2 is the reverse KL(pi || ref) gradient, grad k3 is the *forward*
KL(ref || pi) gradient. ``importance_weighted=True`` multiplies the loss term by
w = pi / pi_old (differentiated; DeepSeek-V3.2, 2025), which makes k3's gradient the
reverse-KL one. In the reward (PPO-RLHF, Ziegler et al. 2019) the estimate enters the return
with no gradient, evaluated at pi_old.

What is clamped, and only where an exponential needs it: k3 caps log rho at +20 (the reference gives the token
e^20 ~ 4.9e8 times the policy's probability; beyond, exp would dominate the loss and overflow float32 past 88), so
there its value is expm1(20) - 20 and its gradient 0; the importance weight's log-ratio is clamped to +-20 before exp.
k1 and k2 are never clamped: no exp, and a clamp would zero k2's gradient log pi - log ref exactly where the
reference (or a distillation teacher, `components.distill`) rejects the token most. ``kl/clamped_frac`` is the share
of the counted tokens whose term was clamped.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import KLPenalty

Estimator = Literal["k1", "k2", "k3"]
LOG_RATIO_CAP = 20.0  # the largest log rho (k3) or |log pi / pi_old| (importance weight) put through exp


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, estimator: Estimator) -> Tensor:
    """Per-token KL(pi || ref) estimate from sampled-token log-probs; k3 caps log rho at +20 (module docstring).
    Shape: (B, R)."""
    log_rho = ref_logprobs.float() - logprobs.float()
    if estimator == "k1":
        return -log_rho
    if estimator == "k2":
        return 0.5 * log_rho.square()
    if estimator == "k3":
        capped = log_rho.clamp(max=LOG_RATIO_CAP)
        return torch.expm1(capped) - capped
    raise ValueError(f"unknown KL estimator {estimator!r}; use k1, k2 or k3")


class KLRegularizer(KLPenalty):
    """KL penalty against the reference model; its coefficient is a buffer, so checkpoints carry it.

    Adaptive control (Ziegler et al. 2019, arXiv:1909.08593, sec. 2.2) when ``target`` is set:
        e = clip(KL / target - 1, -0.2, 0.2);   beta <- beta * (1 + e * n / horizon)
    with KL the batch-mean sequence KL (sum of k1 over tokens, at pi_old) and n the samples seen.
    A coefficient of 0 with no target needs no reference model, and none is loaded.

    ``refresh_every``: reset the reference to the current policy every N iterations (DeepSeekMath's
    iterative GRPO; a moving anchor lets long runs leave the initial policy's neighbourhood). The
    reference's weights are then state, and checkpoints carry them.
    """

    def __init__(
        self,
        coef: float = 0.0,
        estimator: Estimator = "k3",
        placement: Literal["loss", "reward"] = "loss",
        target: float | None = None,
        horizon: int = 10000,
        importance_weighted: bool = False,
        refresh_every: int | None = None,
    ):
        """
        Args:
            coef: beta, the initial KL coefficient.
            estimator: k1, k2 or k3 (see module docstring for what each does in the loss).
            placement: loss (differentiated term, GRPO) or reward (per-token penalty in the return, PPO-RLHF).
            target: target sequence KL in nats for the adaptive controller; None keeps beta fixed.
            horizon: controller horizon (larger adapts more slowly).
            importance_weighted: loss placement only: weight the term by pi / pi_old (DeepSeek-V3.2).
            refresh_every: copy the policy into the reference every this many iterations (None = never).
        """
        super().__init__()
        if estimator not in ("k1", "k2", "k3") or placement not in ("loss", "reward"):
            raise ValueError(
                f"KLRegularizer: estimator must be k1|k2|k3 and placement loss|reward, got {estimator!r}, {placement!r}"
            )
        if coef < 0 or (target is not None and target <= 0) or horizon <= 0:
            raise ValueError(f"KLRegularizer: need coef >= 0, target > 0, horizon > 0; got {coef}, {target}, {horizon}")
        if importance_weighted and placement != "loss":
            raise ValueError("KLRegularizer: importance_weighted applies to placement='loss' only")
        if refresh_every is not None and refresh_every < 1:
            raise ValueError(f"KLRegularizer: refresh_every must be >= 1 (or null), got {refresh_every}")
        self.estimator, self.placement, self.target, self.horizon = estimator, placement, target, horizon
        self.refresh_every = refresh_every
        self.importance_weighted = importance_weighted
        self.register_buffer("coef", torch.tensor(float(coef), dtype=torch.float64))

    @property
    def active(self) -> bool:
        return self.target is not None or float(self.coef) > 0

    def refresh_due(self, iterations_done: int) -> bool:
        """True after the iteration that completes a multiple of ``refresh_every``."""
        return self.active and self.refresh_every is not None and iterations_done % self.refresh_every == 0

    @property
    def requires(self) -> frozenset[str]:
        if not self.active:
            return frozenset()
        needs_old = self.placement == "reward" or self.importance_weighted
        return frozenset({"ref_logprobs"} | ({"old_logprobs"} if needs_old else set()))

    def reward_penalty(self, batch: RolloutBatch) -> Tensor:
        """-beta * k(pi_old, ref) per token for placement='reward', else zeros. No gradient. Shape: (B, R)."""
        mask = batch.action_tokens  # never on an environment's tokens
        if self.placement != "reward" or not self.active:
            return torch.zeros_like(mask)
        kl = kl_estimate(batch.old_logprobs, batch.ref_logprobs, self.estimator)
        return (-self.coef.float() * kl * mask).detach()

    def loss_term(self, logprobs: Tensor, batch: RolloutBatch) -> Tensor:
        """beta * k(pi_theta, ref) per token for placement='loss', else zeros. Differentiable. Shape: (B, R)."""
        if self.placement != "loss" or not self.active:
            return torch.zeros_like(logprobs, dtype=torch.float32)
        kl = kl_estimate(logprobs, batch.ref_logprobs, self.estimator)
        if self.importance_weighted:
            kl = kl * (logprobs.float() - batch.old_logprobs.float()).clamp(-LOG_RATIO_CAP, LOG_RATIO_CAP).exp()
        return self.coef.float() * kl

    def clamped(self, logprobs: Tensor, batch: RolloutBatch) -> Tensor:
        """1 where this regulariser's term at ``logprobs`` (pi_theta in the loss, pi_old in the reward) was clamped:
        k3's log rho above +20, or (importance-weighted) a log pi / pi_old beyond +-20; else 0. No gradient. Shape: (B, R)."""
        with torch.no_grad():
            out = torch.zeros_like(logprobs, dtype=torch.float32)
            if not self.active:
                return out
            if self.estimator == "k3":
                out = out + (batch.ref_logprobs.float() - logprobs.float() > LOG_RATIO_CAP).float()
            if self.importance_weighted and self.placement == "loss":
                out = out + ((logprobs.float() - batch.old_logprobs.float()).abs() > LOG_RATIO_CAP).float()
            return out.clamp(max=1.0)

    @torch.no_grad()
    def update(self, kl: Tensor | float, n: int) -> None:
        """One controller step from the observed mean sequence KL over ``n`` samples."""
        if self.target is None:
            return
        error = torch.clamp(
            torch.as_tensor(kl, dtype=torch.float64, device=self.coef.device) / self.target - 1.0, -0.2, 0.2
        )
        self.coef.mul_(1.0 + error * n / self.horizon)
