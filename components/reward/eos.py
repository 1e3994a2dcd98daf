"""`MissingEOSPenalty`: a truncated response gets a fixed score instead of its reward."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Reward

from .wrapper import RewardWrapper


class MissingEOSPenalty(nn.Module, RewardWrapper):
    """R = penalty if the response hit ``max_new_tokens`` without EOS, else the wrapped reward's score.

    The "missing EOS" trick of RLHF implementations (Huang et al. 2024, "The N+ implementation
    details of RLHF with PPO"): a reward model scores a cut-off response as if
    it were finished, so truncation is replaced by a constant the policy learns to avoid. A wrapped reward that is a
    module (`Shaped`, `RewardModel`) is its submodule: its state is checkpointed with it.
    """

    def __init__(self, reward: Reward, penalty: float = -1.0):
        """
        Args:
            reward: the reward of responses that ended with an EOS.
            penalty: the score of a truncated response.
        """
        super().__init__()
        self.reward, self.penalty = reward, penalty
        self.requires = reward.requires | frozenset({"truncated"})

    def __call__(self, batch: RolloutBatch) -> Tensor:
        batch.require(["truncated"], self.name)
        inner = self.reward.score(batch)  # its checks, and its on_failure for rows it cannot score
        self.last_metrics = inner.metrics
        scores = inner.total.to(batch.response_ids.device)
        return torch.where(batch.truncated.bool(), torch.full_like(scores, self.penalty), scores)
