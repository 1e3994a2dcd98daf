"""Phase 3 of an RL iteration, estimate: per-token rewards (the score on the model's last token, an environment's
per-turn rewards, the KL penalty when it sits in the reward), then the advantage estimator's advantages and returns."""

from __future__ import annotations

from lightning_rl.core.batch import RolloutBatch, terminal_rewards
from lightning_rl.core.contracts import AdvantageEstimator, KLPenalty
from lightning_rl.core.ops import explained_variance, masked_mean, sequence_kl
from lightning_rl.loop.metrics import WeightedMeans


def estimate(
    batch: RolloutBatch, advantage: AdvantageEstimator, kl: KLPenalty | None, metrics: WeightedMeans
) -> RolloutBatch:
    """``batch`` with ``token_rewards``, ``advantages`` and ``returns``; their statistics go to ``metrics``."""
    rewards = terminal_rewards(batch.scores, batch.action_tokens)
    if batch.env_rewards is not None:  # multi-turn: an environment's rewards, on the last token of their turn
        rewards = rewards + batch.env_rewards
    if kl is not None:
        rewards = rewards + kl.reward_penalty(batch)
        if kl.placement == "reward" and kl.active:
            metrics.add("kl/clamped_frac", masked_mean(kl.clamped(batch.old_logprobs, batch), batch.action_tokens))
    batch = batch.replace(token_rewards=rewards)
    advantages, returns = advantage(batch)
    batch = batch.replace(advantages=advantages, returns=returns)
    mask = batch.loss_mask
    metrics.add("advantage/mean", masked_mean(advantages, mask))
    metrics.add("advantage/std", masked_mean((advantages - masked_mean(advantages, mask)).square(), mask).sqrt())
    if batch.values is not None and returns is not None:
        metrics.add("critic/explained_var", explained_variance(batch.values, returns, mask))
    if batch.old_logprobs is not None and batch.ref_logprobs is not None:
        counted = batch.counted
        metrics.add(
            "kl/ref", masked_mean(sequence_kl(batch.old_logprobs, batch.ref_logprobs, mask), counted), counted.sum()
        )
    if batch.old_logprobs is not None and batch.teacher_logprobs is not None:
        add_distill_metrics(metrics, batch, mask.sum())
    return batch


def add_distill_metrics(metrics: WeightedMeans, batch: RolloutBatch, tokens) -> None:
    """``distill/reverse_kl``: the token mean of log pi_old - log pi_T on the tokens that count (k1, an unbiased
    estimate of the per-token reverse KL to the teacher); ``distill/teacher_logprob_mean``: the teacher's token mean."""
    mask = batch.loss_mask
    metrics.add("distill/reverse_kl", masked_mean(batch.old_logprobs - batch.teacher_logprobs, mask), tokens)
    metrics.add("distill/teacher_logprob_mean", masked_mean(batch.teacher_logprobs, mask), tokens)
