"""`RewardWrapper`: what a reward computed from another reward's scores (`Shaped`, `MissingEOSPenalty`) takes from it."""

from __future__ import annotations

from lightning_rl.core.contracts import Reward


class RewardWrapper(Reward):
    """A reward over ``self.reward``'s scores: named after it (``Shaped(ExactMatch)``), its part in a `Composite` named
    as the inner reward's, set up with it, reading the dataset columns it reads, scoring with its learned model."""

    reward: Reward

    @property
    def name(self) -> str:
        return f"{type(self).__name__}({self.reward.name})"

    @property
    def part_name(self) -> str:
        return self.reward.part_name

    @property
    def model_path(self) -> str | None:
        return self.reward.model_path

    def setup(self, tokenizer) -> None:
        self.reward.setup(tokenizer)

    def data_columns(self) -> frozenset[str]:
        return self.reward.data_columns()
