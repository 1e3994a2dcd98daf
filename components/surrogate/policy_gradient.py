"""`PolicyGradient`: the plain REINFORCE surrogate, no ratio and no clip."""

from __future__ import annotations

from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Surrogate

from .base import OffPolicyCorrection, ratio_metrics, token_log_ratio


class PolicyGradient(Surrogate):
    """REINFORCE (Williams 1992), per token: loss = -A * log pi_theta, whose gradient is -A grad log pi.

    An on-policy estimator: with ``ppo_epochs`` or ``num_mini_batches`` above 1 the later steps
    reuse samples of an older policy with no importance weight (use `ClippedSurrogate` or
    `CISPO` there). The ratio to ``old_logprobs`` is only reported (it is 1 on policy). With
    `SeqMeanTokenSum` the loss is the sequence log-likelihood weighting of REINFORCE / RLOO /
    ReMax; an optional `OffPolicyCorrection` weights tokens for the sampler/trainer mismatch.
    """

    requires = frozenset({"advantages"})

    def __init__(self, correction: OffPolicyCorrection | None = None):
        """
        Args:
            correction: optional TIS/MIS correction for the sampler/trainer mismatch.
        """
        super().__init__(correction)

    def per_token_loss(self, logprobs: Tensor, batch: RolloutBatch) -> tuple[Tensor, dict[str, Tensor]]:
        loss = -batch.advantages.float() * logprobs.float()  # (B, R)
        metrics = {}
        if batch.old_logprobs is not None:
            log_ratio = token_log_ratio(logprobs, batch.old_logprobs).detach()
            metrics = ratio_metrics(log_ratio.exp(), log_ratio, batch.loss_mask)
        return loss, metrics
