"""`ReasoningGymScore`: a reasoning-gym task's own scorer as the reward of the prompts ``reasoning_gym:<task>`` gives."""

from __future__ import annotations

import json

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch

from .base import Reward, column


class ReasoningGymScore(Reward):
    """``score_answer(completion, entry)`` of the task that generated each prompt (1.0 right, 0.0 wrong, partial credit
    where the task gives it), read from the data's ``reasoning_gym`` column (``data.train_data: reasoning_gym:<task>``)."""

    def __init__(self, entry_key: str = "reasoning_gym", extract: str | None = None, full_marks_only: bool = False):
        """
        Args:
            entry_key: the column holding each prompt's task and entry (written by the ``reasoning_gym:`` data source).
            extract: optional regex; its first group (or whole match) is scored instead of the whole completion.
            full_marks_only: a score below 1 counts 0. Partial credit can be gamed: basic_arithmetic gives
                len(answer) / len(completion) to a completion holding the answer anywhere, and a small policy learns
                to write long digit strings (its exact accuracy fell 0.15 -> 0.03 in 50 iterations).
        """
        import re

        self.entry_key, self.pattern = entry_key, re.compile(extract) if extract else None
        self.full_marks_only = full_marks_only
        self._scorers: dict = {}

    def _scorer(self, task: str):
        if task not in self._scorers:
            try:
                import reasoning_gym
            except ImportError:
                raise ImportError(
                    "ReasoningGymScore scores with reasoning-gym: pip install 'lightning-rl[agents]'"
                ) from None
            self._scorers[task] = reasoning_gym.get_score_answer_fn(task)
        return self._scorers[task]

    def _answer(self, completion: str) -> str | None:
        if self.pattern is None:
            return completion.strip()
        found = self.pattern.search(completion)
        return None if found is None else (found.group(1) if found.groups() else found.group(0)).strip()

    def __call__(self, batch: RolloutBatch) -> Tensor:
        scores = []
        for completion, record in zip(
            column(batch, "completions", self.name), column(batch, self.entry_key, self.name)
        ):
            record = json.loads(record) if isinstance(record, str) else record
            answer = self._answer(completion)
            scores.append(0.0 if answer is None else float(self._scorer(record["task"])(answer, record["entry"])))
        scores = torch.tensor(scores, dtype=torch.float32, device=batch.response_ids.device)  # (B,)
        return (scores >= 1).float() if self.full_marks_only else scores
