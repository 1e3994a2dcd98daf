"""`DistillAdvantage`: on-policy distillation's dense signal, the negative reverse-KL sample on each sampled token,
composed with any estimator's task advantage (a weight for each).

    k_t = log pi_old(y_t) - log pi_T(y_t)           (k1 with the teacher as reference: components.kl, never clamped)
    placement="advantage":  A_t = task_weight * A_t^task - kl_weight * k_t
    placement="reward":     r_t <- task_weight * r_t - kl_weight * k_t, then A = estimator(r)

Thinking Machines, "On-Policy Distillation" (2025): the per-token advantage is -k_t, no discount (each token is
credited with its own KL only), with the policy-gradient loss; E[k_t] over the student's samples is the per-token
reverse KL(pi || pi_T) (Agarwal et al. 2024, GKD, arXiv:2306.13649, on-policy with the reverse KL). In the reward
instead, an estimator with reward-to-go (GAE, REINFORCE++) turns it into the sequence-level reverse KL's gradient,
later tokens' KL included; a group estimator (GRPO) sees each sample's summed KL as part of its return.
``estimator`` None with placement "advantage" is pure distillation (no task advantage); the task reward is still
computed and logged. With ``kl_weight`` 0 too there is no advantage at all: a recipe whose update is a loss term
alone (`components.distill.TeacherKL`, the exact reverse KL: configs/distill.yaml). Whitening and clipping (this class's own settings) act on the combined advantage; the task
estimator's act on its part alone.
"""

from __future__ import annotations

from typing import Literal

import torch

from components.kl import kl_estimate
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import AdvantageEstimator, Advantages, Whiten


class DistillAdvantage(AdvantageEstimator):
    """A_t = task_weight * A_t^task - kl_weight * (log pi_old(y_t) - log pi_T(y_t)): on-policy distillation's per-token
    negative reverse-KL sample (Thinking Machines 2025; GKD, arXiv:2306.13649) added to any estimator's advantage."""

    def __init__(
        self,
        estimator: AdvantageEstimator | None = None,
        task_weight: float = 1.0,
        kl_weight: float = 1.0,
        placement: Literal["advantage", "reward"] = "advantage",
        whiten: Whiten = "none",
        shift_mean: bool = True,
        clip: float | None = None,
    ):
        """
        Args:
            estimator: the task reward's estimator (GroupNormalized, GAE, ...); None = pure distillation.
            task_weight: the weight of the task advantage (or, in the reward, of the task reward).
            kl_weight: the weight of the distillation term, -(log pi_old - log pi_T) per token.
            placement: advantage (added to the task advantage, undiscounted) or reward (added to each token's reward
                before ``estimator``).
            whiten: see `AdvantageEstimator` (on the combined advantage).
            shift_mean: see `AdvantageEstimator`.
            clip: see `AdvantageEstimator`.
        """
        super().__init__(whiten, shift_mean, clip)
        if placement not in ("advantage", "reward"):
            raise ValueError(f"DistillAdvantage: placement must be advantage or reward, got {placement!r}")
        if placement == "reward" and estimator is None:
            raise ValueError("DistillAdvantage: placement 'reward' needs an estimator to turn rewards into advantages")
        if task_weight < 0 or kl_weight < 0:
            raise ValueError(f"DistillAdvantage: weights must be >= 0, got task {task_weight}, kl {kl_weight}")
        self.estimator, self.task_weight, self.kl_weight, self.placement = estimator, task_weight, kl_weight, placement
        inner = estimator.requires if estimator is not None else frozenset()
        self.requires = inner | ({"old_logprobs", "teacher_logprobs"} if kl_weight > 0 else set())
        self.group_relative = estimator is not None and estimator.group_relative and task_weight > 0
        self.produces_returns = estimator is not None and estimator.produces_returns

    def distill_term(self, batch: RolloutBatch) -> torch.Tensor:
        """-kl_weight * k1(pi_old, pi_T) on the model's sampled tokens, zero elsewhere, fp32. Shape: (B, R)."""
        if self.kl_weight == 0:
            return torch.zeros_like(batch.action_tokens)
        return -self.kl_weight * kl_estimate(batch.old_logprobs, batch.teacher_logprobs, "k1") * batch.action_tokens

    def estimate(self, batch: RolloutBatch) -> Advantages:
        distill = self.distill_term(batch)  # (B, R)
        if self.placement == "reward":
            return self.estimator(batch.replace(token_rewards=self.task_weight * batch.token_rewards + distill))
        if self.estimator is None:
            return Advantages(distill, None)
        task = self.estimator(batch)
        return Advantages(self.task_weight * task.advantages + distill, task.returns)
