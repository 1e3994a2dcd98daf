"""`ReMax`: the baseline is the reward of one greedy response to the same prompt."""

from __future__ import annotations

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import AdvantageEstimator, Advantages, Whiten
from lightning_rl.core.ops import broadcast_to_tokens, group_view, sequence_rewards


class ReMax(AdvantageEstimator):
    """ReMax (Li et al. 2023, arXiv:2310.10505, Algorithm 1): A_i = R_i - r(x, y_greedy), per token of sample i.

    The rollout appends one greedy response per prompt to its group, flagged ``is_greedy``
    (``HFRollout(greedy_baseline=True)``); it never enters the loss and its advantage is 0. The
    baseline does not depend on the sampled responses, so the gradient stays unbiased. R_i is the
    sequence return (score minus any KL-in-reward); the baseline is the greedy response's score
    alone (as in the paper, whose baseline is the reward model's score; a greedy decode's log-ratio
    to the reference is no estimate of the policy's KL).
    """

    requires = AdvantageEstimator.requires | frozenset({"group_ids", "is_greedy", "scores"})

    def __init__(self, whiten: Whiten = "none", shift_mean: bool = True, clip: float | None = None):
        """
        Args:
            whiten: see `AdvantageEstimator`.
            shift_mean: see `AdvantageEstimator`.
            clip: see `AdvantageEstimator`.
        """
        super().__init__(whiten, shift_mean, clip)

    def __call__(self, batch: RolloutBatch) -> Advantages:
        if batch.batch_size and (batch.is_greedy is None or not bool(batch.is_greedy.any())):  # empty: nothing kept
            raise ValueError(
                "ReMax needs one greedy response per prompt as its baseline, but the batch has no greedy rows; "
                "set greedy_baseline: true on the rollout (components.rollout.HFRollout)"
            )
        return super().__call__(batch)

    def estimate(self, batch: RolloutBatch) -> Advantages:
        greedy = group_view(batch.is_greedy.bool(), batch.group_ids)  # (n_groups, G + 1)
        if not bool((greedy.sum(-1) == 1).all()):
            raise ValueError(
                "ReMax: every group must hold exactly one greedy row (HFRollout greedy_baseline: true appends one per prompt)"
            )
        scores = group_view(batch.scores.float(), batch.group_ids)  # (n_groups, G + 1)
        baseline = (scores * greedy).sum(-1, keepdim=True)  # (n_groups, 1)
        returns = group_view(sequence_rewards(batch), batch.group_ids)  # (n_groups, G + 1)
        advantages = ((returns - baseline) * ~greedy).reshape(-1)  # (B,)
        return Advantages(broadcast_to_tokens(advantages, batch.action_tokens), None)
