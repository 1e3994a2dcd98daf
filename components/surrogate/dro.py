"""`DRO`: direct reward optimisation, a regression of log pi towards the advantage with a quadratic trust region."""

from __future__ import annotations

from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Surrogate

from .base import OffPolicyCorrection, ratio_metrics, token_log_ratio


class DRO(Surrogate):
    """DRO (Richemond et al. 2024, arXiv:2405.19107, eq. 6; the per-token form Kimi k1.5 trains with, arXiv:2501.12599
    eq. 3), per token:

        loss = -(A log pi_theta - beta / 2 (log pi_theta - log q)^2)

    ``q`` is the sampling policy (``old_logprobs``). The quadratic term pulls log pi back towards log q with strength
    beta, so the update stays near the sampler without a clip: d loss / d log pi = -A + beta (log pi - log q). The
    papers regress a value-corrected (soft) advantage, A = r - tau log V; here A is whatever the caller gives (the Tinker
    API's ``dro`` loss leaves the soft advantage to the client). ``beta`` is the coefficient of the squared log-ratio.
    """

    def __init__(self, beta: float = 0.05, correction: OffPolicyCorrection | None = None):
        """
        Args:
            beta: strength of the quadratic penalty on log pi - log q (> 0).
            correction: optional TIS/MIS correction for the sampler/trainer mismatch.
        """
        super().__init__(correction)
        if not beta > 0:
            raise ValueError(f"DRO: beta must be > 0, got {beta}")
        self.beta = beta

    def per_token_loss(self, logprobs: Tensor, batch: RolloutBatch) -> tuple[Tensor, dict[str, Tensor]]:
        # the penalty reads the unclamped difference: its gradient beta (log pi - log q) grows with the distance
        diff = logprobs.float() - batch.old_logprobs.float()  # (B, R)
        loss = -(batch.advantages.float() * logprobs.float() - 0.5 * self.beta * diff.square())
        log_ratio = token_log_ratio(logprobs, batch.old_logprobs).detach()
        return loss, ratio_metrics(log_ratio.exp(), log_ratio, batch.loss_mask)
