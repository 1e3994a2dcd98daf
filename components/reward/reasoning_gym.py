"""`ReasoningGymScore`: a reasoning-gym task's own scorer as the reward of the prompts ``reasoning_gym:<task>`` gives.

Each prompt's entry (the question, the gold answer and the metadata the task's scorer reads) travels in a text column
as JSON that keeps Python's types (`entry_to_json`): plain JSON turns the tuples of a grid into lists, and the
``arc_agi`` / ``rearc`` scorers then gave the exact gold answer 0.05 instead of 1.
"""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Reward
from lightning_rl.core.contracts.reward import OnFailure, column

TAGS = ("__tuple__", "__set__", "__frozenset__", "__dict__")
"""How `entry_to_json` writes what JSON has no type for: ``{"__tuple__": [...]}``, ``{"__dict__": [[key, value], ...]}``
(a dict with keys other than text, or one that would read as a tag)."""


def entry_to_json(record: dict) -> str:
    """``record`` (``{"task": ..., "entry": ...}``) as JSON that `entry_from_json` reads back equal, types included.
    Raises TypeError naming a value of another type (numpy scalars are written as Python numbers)."""
    return json.dumps({key: _tagged(value, key) for key, value in record.items()})


def entry_from_json(text: str) -> dict:
    return json.loads(text, object_hook=_untagged)


def _tagged(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_tagged(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (tuple, set, frozenset)):
        tag = {tuple: "__tuple__", set: "__set__", frozenset: "__frozenset__"}[type(value)]
        return {tag: [_tagged(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not (len(value) == 1 and next(iter(value)) in TAGS):
            return {k: _tagged(v, f"{where}[{k!r}]") for k, v in value.items()}
        return {"__dict__": [[_tagged(k, where), _tagged(v, f"{where}[{k!r}]")] for k, v in value.items()]}
    if isinstance(value, (np.ndarray, np.generic)) and value.ndim == 0:
        return value.item()
    raise TypeError(f"{where} is a {type(value).__module__}.{type(value).__name__}, which cannot be stored as text")


def _untagged(obj: dict) -> Any:
    if len(obj) == 1:
        (tag, items), *_ = obj.items()
        if tag == "__tuple__":
            return tuple(items)
        if tag == "__set__":
            return set(items)
        if tag == "__frozenset__":
            return frozenset(items)
        if tag == "__dict__":  # its keys were read back first (a tuple's tag is read before the dict holding it)
            return dict(items)
    return obj


class ReasoningGymScore(Reward):
    """``score_answer(answer, entry)`` of the task that generated each prompt (1.0 right, 0.0 wrong, partial credit
    where the task gives it), read from the data's ``reasoning_gym`` column (``data.train_data: reasoning_gym:<task>``).

    The answer is the completion (or ``extract``'s group) with surrounding whitespace stripped (``str.strip()``): a
    trailing newline or space would fail the tasks that compare the answer exactly. A scorer that raises (e.g.
    ``prime_factorization``'s on free text) scores 0; the fraction of such samples is ``reward/scorer_error_frac``,
    and the first error is warned about once.
    """

    def __init__(
        self,
        entry_key: str = "reasoning_gym",
        extract: str | None = None,
        full_marks_only: bool = False,
        on_failure: OnFailure = "raise",
        failure_score: float = 0.0,
    ):
        """
        Args:
            entry_key: the column holding each prompt's task and entry (written by the ``reasoning_gym:`` data source).
            extract: optional regex; its first group (or whole match) is scored instead of the whole completion.
            full_marks_only: a score below 1 counts 0. Partial credit can be gamed: basic_arithmetic gives
                len(answer) / len(completion) to a completion holding the answer anywhere, and a small policy learns
                to write long digit strings (its exact accuracy fell 0.15 -> 0.03 in 50 iterations).
            on_failure: a row this reward cannot score (it raises): ``raise`` stops the run naming the row; ``score``
                gives it ``failure_score``, counted in ``reward/error_frac``.
            failure_score: the score of such a row with ``on_failure: score``.
        """
        super().__init__(on_failure, failure_score)
        self.entry_key, self.pattern = entry_key, re.compile(extract) if extract else None
        self.full_marks_only = full_marks_only
        self._scorers: dict = {}
        self._warned = False

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

    def _score(self, answer: str, record: dict) -> float | None:
        """The task's score, or None where its scorer raised."""
        task = record["task"]
        if task == "composite":  # its scorer is built from specs the entry lacks; it forwards to the entry's task
            task = record["entry"]["metadata"]["source_dataset"]
        try:
            return float(self._scorer(task)(answer, record["entry"]))
        except Exception as err:  # a task's own code: any type
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"ReasoningGymScore: the {task} scorer raised {type(err).__name__}: {err} on the answer "
                    f"{answer[:80]!r}; such samples score 0 (counted in reward/scorer_error_frac)"
                )
            return None

    def data_columns(self) -> frozenset[str]:
        return frozenset({self.entry_key})

    def __call__(self, batch: RolloutBatch) -> Tensor:
        scores, errors = [], 0
        for completion, record in zip(
            column(batch, "completions", self.name), column(batch, self.entry_key, self.name)
        ):
            record = entry_from_json(record) if isinstance(record, str) else record
            answer = self._answer(completion)
            score = 0.0 if answer is None else self._score(answer, record)
            errors += score is None
            scores.append(score or 0.0)
        scores = torch.tensor(scores, dtype=torch.float32, device=batch.response_ids.device)  # (B,)
        self.last_metrics = {"reward/scorer_error_frac": torch.tensor(errors / max(len(scores), 1))}
        return (scores >= 1).float() if self.full_marks_only else scores
