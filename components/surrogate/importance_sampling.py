"""`ImportanceSampling`: the policy gradient of samples drawn by another policy, reweighted by the likelihood ratio."""

from __future__ import annotations

from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Surrogate

from .base import OffPolicyCorrection, ratio_metrics, token_log_ratio


class ImportanceSampling(Surrogate):
    """Off-policy policy gradient with a per-token importance weight (Degris, White & Sutton 2012, Off-Policy
    Actor-Critic, arXiv:1205.4839, eq. 4), per token:

        loss = -r A,    r = pi_theta / q = exp(log pi_theta - log q)

    ``q`` is the policy that sampled the tokens (``old_logprobs``: the sampler's own log-probs, or the trainer's
    re-scored ones). Unlike `CISPO` the ratio is not detached: d loss / d log pi = -r A, which is the unbiased
    gradient of E_q[r A] = E_pi[A] whatever q is, and reduces to REINFORCE's -A on policy (r = 1). Nothing is
    clipped, so a ratio far from 1 moves the policy as far as it says (use `ClippedSurrogate` or `CISPO` for a trust
    region). This is the Tinker API's ``importance_sampling`` loss, summed over tokens by `TokenSum`.
    """

    def __init__(self, correction: OffPolicyCorrection | None = None):
        """
        Args:
            correction: optional TIS/MIS correction for the sampler/trainer mismatch.
        """
        super().__init__(correction)

    def per_token_loss(self, logprobs: Tensor, batch: RolloutBatch) -> tuple[Tensor, dict[str, Tensor]]:
        log_ratio = token_log_ratio(logprobs, batch.old_logprobs)  # (B, R), gradient flows through log pi
        ratio = log_ratio.exp()
        loss = -ratio * batch.advantages.float()
        return loss, ratio_metrics(ratio.detach(), log_ratio.detach(), batch.loss_mask)
