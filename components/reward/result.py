"""`ResultScore`: the score an agent's episode returned (a verifiers Rubric's reward, or your agent's own) as the reward."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Reward
from lightning_rl.core.contracts.reward import OnFailure, column


class ResultScore(Reward):
    """The number in each row's ``result`` column (an agent's return value): the result itself, or ``result[key]``.
    An episode that failed (its result is None) scores ``failure``."""

    def __init__(
        self,
        key: str | None = "reward",
        failure: float = 0.0,
        on_failure: OnFailure = "raise",
        failure_score: float = 0.0,
    ):
        """
        Args:
            key: the entry of a dict result holding the score (None = the result is the number).
            failure: the score of an episode that raised, hung past its deadline or returned nothing.
            on_failure: a row this reward cannot score (it raises): ``raise`` stops the run naming the row; ``score``
                gives it ``failure_score``, counted in ``reward/error_frac``.
            failure_score: the score of such a row with ``on_failure: score``.
        """
        super().__init__(on_failure, failure_score)
        self.key, self.failure = key, failure

    def __call__(self, batch: RolloutBatch) -> Tensor:
        scores = []
        for i, result in enumerate(column(batch, "result", self.name)):
            value = (
                result
                if self.key is None or result is None
                else (result.get(self.key) if isinstance(result, dict) else None)
            )
            if result is not None and not isinstance(value, (int, float)):
                raise ValueError(
                    f"ResultScore: row {i}'s result {result!r:.100} has no number{'' if self.key is None else f' under {self.key!r}'}; "
                    "return one from the agent, or set model.reward.init_args.key"
                )
            scores.append(self.failure if result is None else float(value))
        return torch.tensor(scores, dtype=torch.float32, device=batch.response_ids.device)
