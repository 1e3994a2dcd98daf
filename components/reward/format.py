"""`Format`: a bonus for responses that follow a required layout (a regex)."""

from __future__ import annotations

import re

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Reward
from lightning_rl.core.contracts.reward import OnFailure, column


class Format(Reward):
    """``bonus`` if the completion matches ``pattern`` (e.g. ``<think>.*</think>\\s*<answer>.*</answer>``), else ``miss``.

    Keep the bonus small next to correctness: a format term is easier to farm than the task.
    The pattern is compiled with DOTALL, so ``.`` spans lines.
    """

    def __init__(
        self,
        pattern: str,
        bonus: float = 0.1,
        miss: float = 0.0,
        full_match: bool = False,
        on_failure: OnFailure = "raise",
        failure_score: float = 0.0,
    ):
        """
        Args:
            pattern: regular expression the completion must match.
            bonus: score of a match.
            miss: score otherwise.
            full_match: the whole (stripped) completion must match, not just a part of it.
            on_failure: a row this reward cannot score (it raises): ``raise`` stops the run naming the row; ``score``
                gives it ``failure_score``, counted in ``reward/error_frac``.
            failure_score: the score of such a row with ``on_failure: score``.
        """
        super().__init__(on_failure, failure_score)
        try:
            self.pattern = re.compile(pattern, re.DOTALL)
        except re.error as err:
            raise ValueError(f"Format: pattern {pattern!r} is not a valid regular expression ({err})") from err
        self.bonus, self.miss, self.full_match = bonus, miss, full_match

    def __call__(self, batch: RolloutBatch) -> Tensor:
        match = self.pattern.fullmatch if self.full_match else self.pattern.search
        scores = [
            self.bonus if match(c.strip() if self.full_match else c) else self.miss
            for c in column(batch, "completions", self.name)
        ]
        return torch.tensor(scores, dtype=torch.float32, device=batch.response_ids.device)
