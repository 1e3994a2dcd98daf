"""`MathVerify`: mathematical equivalence with the reference answer, by Hugging Face's math-verify."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Reward
from lightning_rl.core.contracts.reward import OnFailure, column


class MathVerify(Reward):
    """``correct`` if math-verify finds the completion's answer equal to the reference, else ``wrong``.

    Both sides go through ``math_verify.parse`` (LaTeX, including ``\\boxed{}``, and plain
    expressions; the completion's answer is found anywhere in its text; a reference with no ``$``
    or ``\\boxed`` is read as one LaTeX expression) and are compared by
    ``math_verify.verify`` (numeric, symbolic, sets, intervals), so ``1/2``, ``0.5`` and
    ``\\frac{1}{2}`` agree. A reference answer that does not parse is an error naming it.
    math-verify bounds each call with ``signal.alarm``, which works only in the main thread:
    set ``timeout_seconds=None`` when rewards run in other threads.
    """

    def __init__(
        self,
        answer_key: str = "answer",
        correct: float = 1.0,
        wrong: float = 0.0,
        timeout_seconds: int | None = 5,
        on_failure: OnFailure = "raise",
        failure_score: float = 0.0,
    ):
        """
        Args:
            answer_key: dataset column holding the reference answer.
            correct: score of an equivalent answer.
            wrong: score otherwise (including a completion with no parsable answer).
            timeout_seconds: limit per parse / comparison (None = no limit, for non-main threads).
            on_failure: a row this reward cannot score (it raises): ``raise`` stops the run naming the row; ``score``
                gives it ``failure_score``, counted in ``reward/error_frac``.
            failure_score: the score of such a row with ``on_failure: score``.
        """
        super().__init__(on_failure, failure_score)
        self.answer_key, self.correct, self.wrong, self.timeout_seconds = answer_key, correct, wrong, timeout_seconds

    def _parse_reference(self, answer) -> list:
        from math_verify import parse

        text = str(answer).strip()
        # a bare reference is read as LaTeX: as plain text, "2\pi" would parse as 2 and "10^{3}" as 10
        latex = text if ("$" in text or "\\boxed" in text) else f"${text}$"
        parsed = parse(latex, parsing_timeout=self.timeout_seconds) or parse(text, parsing_timeout=self.timeout_seconds)
        if not parsed:
            raise ValueError(
                f"{self.name}: math-verify cannot parse the reference answer {text!r} (column '{self.answer_key}')"
            )
        return parsed

    def data_columns(self) -> frozenset[str]:
        return frozenset({self.answer_key})

    def __call__(self, batch: RolloutBatch) -> Tensor:
        from math_verify import parse, verify

        answers = column(batch, self.answer_key, self.name)
        references: dict[str, list] = {}
        scores = []
        for completion, answer in zip(column(batch, "completions", self.name), answers):
            key = str(answer)
            if key not in references:
                references[key] = self._parse_reference(answer)
            predicted = parse(completion, parsing_timeout=self.timeout_seconds)
            ok = bool(predicted) and verify(references[key], predicted, timeout_seconds=self.timeout_seconds)
            scores.append(self.correct if ok else self.wrong)
        return torch.tensor(scores, dtype=torch.float32, device=batch.response_ids.device)
