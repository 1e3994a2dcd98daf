"""`DecoupledClip`: PPO for samples from older weights, with the clip and the staleness correction decoupled."""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from lightning_rl.core.batch import RolloutBatch

from .base import OffPolicyCorrection
from .clipped import ClippedSurrogate


class DecoupledClip(ClippedSurrogate):
    """Decoupled PPO (Fu et al. 2025, AReaL, arXiv:2505.24298, eq. 5), per token:

        loss = -w * min(r A, clip(r, 1 - eps_low, 1 + eps_high) A),   r = pi_theta / pi_prox,   w = pi_prox / pi_behav

    pi_behav is the policy version that sampled the token (``rollout_logprobs``: in asynchronous training an older
    one, ``loop.max_staleness`` versions at most); pi_prox, the proximal policy, is the trainer's weights before
    this update (``old_logprobs``: a forward pass of its own when the batch gets several optimizer steps; with one
    step, the update's own forward, detached, which runs on those weights). The clip bounds the step from pi_prox, the
    recent policy, instead of from pi_behav, so a stale batch does not shrink the trust region to nothing;
    w (no gradient) corrects the sampling distribution. ``behaviour_mode="mask"`` zeroes the tokens with
    w > ``behaviour_cap`` (AReaL), ``"truncate"`` uses min(w, cap). With fresh samples (pi_behav = pi_prox up
    to the sampler's numerics) this is PPO with the trainer/sampler correction (TIS/MIS use the same w, so only a
    rejection, ``correction: {mode: reject}``, e.g. of whole sequences with an extreme weight, stacks on top).
    """

    def __init__(
        self,
        eps_low: float = 0.2,
        eps_high: float = 0.2,
        behaviour_cap: float = 5.0,
        behaviour_mode: Literal["mask", "truncate"] = "mask",
        dual_clip: float | None = None,
        level: Literal["token", "sequence"] = "token",
        correction: OffPolicyCorrection | None = None,
    ):
        """
        Args:
            eps_low: lower clip range around pi_prox, r >= 1 - eps_low.
            eps_high: upper clip range, r <= 1 + eps_high.
            behaviour_cap: bound on w = pi_prox / pi_behav.
            behaviour_mode: mask (w = 0 above the cap, AReaL's choice) or truncate (w = min(w, cap)).
            dual_clip: c > 1 for dual-clip PPO on negative advantages; None = off.
            level: token or sequence (GSPO) ratio r.
            correction: an optional rejection on top (``mode: reject``, e.g. ``level: sequence``).
        """
        if correction is not None and correction.mode != "reject":
            raise ValueError(
                f"DecoupledClip: its behaviour weight is already pi_prox / pi_behav, the weight of a {correction.mode!r} correction, so "
                "the two would square it; keep correction for rejection (mode: reject), or use ClippedSurrogate with that correction"
            )
        super().__init__(eps_low, eps_high, dual_clip, level, correction)
        if behaviour_cap <= 0 or behaviour_mode not in ("mask", "truncate"):
            raise ValueError(
                f"DecoupledClip: behaviour_cap must be > 0 and behaviour_mode mask|truncate, got {behaviour_cap}, {behaviour_mode!r}"
            )
        # w = pi_prox / pi_behav is the trainer/sampler weight of TIS (truncate) and MIS without a lower bound (mask)
        self.behaviour = OffPolicyCorrection(mode="mis" if behaviour_mode == "mask" else "tis", cap=behaviour_cap)
        self.behaviour_cap, self.behaviour_mode = behaviour_cap, behaviour_mode
        self.requires = self.requires | self.behaviour.requires

    def per_token_loss(self, logprobs: Tensor, batch: RolloutBatch) -> tuple[Tensor, dict[str, Tensor]]:
        loss, metrics = super().per_token_loss(logprobs, batch)  # (B, R), clipped around pi_prox
        weight, behaviour = self.behaviour(batch)  # (B, R), detached
        metrics["policy/behaviour_weight_mean"] = behaviour["offpolicy/weight_mean"]
        metrics["policy/behaviour_capped_frac"] = behaviour["offpolicy/affected_frac"]
        return loss * weight, metrics
