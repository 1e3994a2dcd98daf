"""`LeaveOneOut`: RLOO's baseline, the mean reward of the other samples of the same prompt."""

from __future__ import annotations

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import AdvantageEstimator, Advantages, Whiten
from lightning_rl.core.ops import broadcast_to_tokens, group_view, sequence_rewards

from .base import reject_greedy_rows


class LeaveOneOut(AdvantageEstimator):
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740, eq. 5):

        A_i = R_i - 1/(G-1) sum_{j != i} R_j  =  G/(G-1) (R_i - mean_g(R))

    broadcast to every token of sample i. The baseline of sample i uses only the other samples,
    so it does not depend on sample i and the gradient stays unbiased; the advantages of a group
    sum to 0, and a group with identical rewards gets A = 0 exactly. R_i is the sequence return:
    the score minus any KL-in-reward. Needs at least two samples per prompt.
    """

    group_relative = True

    def __init__(self, whiten: Whiten = "none", shift_mean: bool = True, clip: float | None = None):
        """
        Args:
            whiten: see `AdvantageEstimator` (the leave-one-out baseline already centres the returns: a second mean shift is not advised).
            shift_mean: see `AdvantageEstimator`.
            clip: see `AdvantageEstimator`.
        """
        super().__init__(whiten, shift_mean, clip)

    def estimate(self, batch: RolloutBatch) -> Advantages:
        batch.require(["group_ids"], "LeaveOneOut")
        reject_greedy_rows(batch, "LeaveOneOut")
        rewards = sequence_rewards(batch)  # (B,)
        grouped = group_view(rewards, batch.group_ids)  # (n_groups, G)
        g = grouped.shape[1]
        if g < 2 and grouped.numel():  # an empty batch (dynamic sampling kept nothing) has nothing to estimate
            raise ValueError(
                "LeaveOneOut needs at least 2 samples per prompt for a leave-one-out baseline; set model.rollout.init_args.group_size >= 2"
            )
        # measured from the group's first reward (the advantage is shift-invariant), so identical rewards give 0 exactly
        offsets = grouped - grouped[:, :1]  # (n_groups, G)
        baseline = (offsets.sum(-1, keepdim=True) - offsets) / (g - 1)  # (n_groups, G)
        return Advantages(broadcast_to_tokens((offsets - baseline).reshape(-1), batch.action_tokens), None)
