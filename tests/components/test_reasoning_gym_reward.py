"""ReasoningGymScore: the generating task's own scorer; ResultScore: an agent's returned score, failures scored."""

from __future__ import annotations

import pytest
import torch

from components.reward import ResultScore
from tests.helpers import batch_from_scores


def test_the_task_scorer_reads_each_rows_entry():
    pytest.importorskip("reasoning_gym")
    from components.reward import ReasoningGymScore
    from lightning_rl.data.sources import load_rows

    rows = load_rows(
        "reasoning_gym:basic_arithmetic?min_terms=2&max_terms=2&max_digits=2&operators=+&size=3&test_size=3", "test"
    ).to_list()
    completions = [rows[0]["answer"], str(int(rows[1]["answer"]) + 1), f"The answer is {rows[2]['answer']}."]
    batch = batch_from_scores(
        torch.zeros(3), columns={"completions": completions, "reasoning_gym": [r["reasoning_gym"] for r in rows]}
    )
    whole = ReasoningGymScore()(batch).tolist()
    assert whole[:2] == [1.0, 0.0] and 0 < whole[2] < 1  # the task's partial credit for an answer buried in words
    assert ReasoningGymScore(extract=r"answer is (-?\d+)")(batch).tolist() == [0.0, 0.0, 1.0]  # no match scores 0
    assert ReasoningGymScore(full_marks_only=True)(batch).tolist() == [1.0, 0.0, 0.0]


def test_result_score_reads_the_agents_number_and_scores_failures():
    batch = batch_from_scores(torch.zeros(3), columns={"result": [{"reward": 0.5}, None, {"reward": 1}]})
    assert ResultScore("reward", failure=-1.0)(batch).tolist() == [0.5, -1.0, 1.0]
    with pytest.raises(ValueError, match="row 0's result .* has no number under 'score'"):
        ResultScore("score")(batch)
