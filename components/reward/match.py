"""Verifiable rewards that compare a completion with a reference answer."""

from __future__ import annotations

import re

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Reward
from lightning_rl.core.contracts.reward import OnFailure, column


class ExactMatch(Reward):
    """1.0 if the (extracted, stripped) completion equals the reference answer, else 0.0."""

    def __init__(
        self,
        answer_key: str = "answer",
        extract: str | None = None,
        correct: float = 1.0,
        wrong: float = 0.0,
        on_failure: OnFailure = "raise",
        failure_score: float = 0.0,
    ):
        """
        Args:
            answer_key: dataset column holding the reference answer.
            extract: optional regex; its first group (or whole match) is compared instead of the full completion.
                A completion the regex does not match scores ``wrong``.
            correct: score of a match.
            wrong: score otherwise.
            on_failure: a row this reward cannot score (it raises): ``raise`` stops the run naming the row; ``score``
                gives it ``failure_score``, counted in ``reward/error_frac``.
            failure_score: the score of such a row with ``on_failure: score``.
        """
        super().__init__(on_failure, failure_score)
        self.answer_key = answer_key
        self.pattern = re.compile(extract) if extract else None
        self.correct, self.wrong = correct, wrong

    def data_columns(self) -> frozenset[str]:
        return frozenset({self.answer_key})

    def _answer(self, completion: str) -> str | None:
        if self.pattern is None:
            return completion.strip()
        found = self.pattern.search(completion)
        if found is None:
            return None
        return (found.group(1) if found.groups() else found.group(0)).strip()

    def __call__(self, batch: RolloutBatch) -> Tensor:
        answers = column(batch, self.answer_key, self.name)
        scores = [
            self.correct if (got := self._answer(c)) is not None and got == str(ref).strip() else self.wrong
            for c, ref in zip(column(batch, "completions", self.name), answers)
        ]
        return torch.tensor(scores, dtype=torch.float32, device=batch.response_ids.device)
