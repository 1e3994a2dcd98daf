"""`Composite`: a weighted sum of rewards."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_rl.batch import RolloutBatch

from .base import Reward, RewardInputs, as_scores


class Composite(Reward):
    """R = sum_k w_k R_k: e.g. correctness plus a format bonus plus DAPO's overlong penalty.

    Each part is checked like a top-level reward (B finite scores, errors name the part).
    """

    def __init__(self, rewards: list[Reward], weights: list[float] | None = None):
        """
        Args:
            rewards: the reward terms (each a class_path / init_args entry in YAML).
            weights: one weight per term (None = all 1.0).
        """
        if not rewards:
            raise ValueError("Composite: give at least one reward in `rewards`")
        weights = [1.0] * len(rewards) if weights is None else list(weights)
        if len(weights) != len(rewards):
            raise ValueError(f"Composite: {len(rewards)} rewards but {len(weights)} weights; give one weight per reward")
        self.rewards, self.weights = list(rewards), [float(w) for w in weights]
        self.requires = frozenset().union(*(r.requires for r in self.rewards))

    @property
    def name(self) -> str:
        return "Composite(" + ", ".join(f"{w:g}*{r.name}" for r, w in zip(self.rewards, self.weights)) + ")"

    def setup(self, tokenizer) -> None:
        for reward in self.rewards:
            reward.setup(tokenizer)

    def __call__(self, batch: RolloutBatch, meta: RewardInputs) -> Tensor:
        total = torch.zeros(batch.batch_size, dtype=torch.float32)
        for reward, weight in zip(self.rewards, self.weights):
            total += weight * as_scores(reward(batch, meta), batch.batch_size, reward.name, meta)
        return total.to(batch.response_ids.device)
