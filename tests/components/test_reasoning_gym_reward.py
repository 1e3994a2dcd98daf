"""ReasoningGymScore: the generating task's own scorer; ResultScore: an agent's returned score, failures scored."""

from __future__ import annotations

import pytest
import torch

from components.reward import ResultScore
from components.reward.reasoning_gym import entry_from_json, entry_to_json
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


def _tasks() -> list[str]:
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:
        return []
    return sorted(DATASETS)


NO_GOLD_ANSWER = {"boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour"}
"""Tasks whose entries hold no answer (None): their scorers check a solution against the puzzle."""


@pytest.mark.parametrize("task", _tasks())
def test_every_tasks_gold_answer_scores_one(task):
    """Each task's entries read back from how the data source stores them equal the package's own (types included:
    arc_agi's and rearc's tuple grids made lists scored the exact answer 0.05), and the rows' gold answers score 1."""
    import reasoning_gym

    from components.reward import ReasoningGymScore
    from lightning_rl.data.reasoning_gym import reasoning_gym_rows

    if task == "composite":  # built from other tasks' specs (none by default), which a data source string cannot give
        from reasoning_gym.composite import DatasetSpec

        specs = [DatasetSpec("arc_agi", 1.0, {}), DatasetSpec("basic_arithmetic", 1.0, {})]
        package = reasoning_gym.create_dataset(task, seed=7, size=4, datasets=specs)
        rows = [
            {"answer": str(e["answer"]), "reasoning_gym": entry_to_json({"task": task, "entry": e})} for e in package
        ]
        assert {e["metadata"]["source_dataset"] for e in package} == {"arc_agi", "basic_arithmetic"}
    else:
        package = reasoning_gym.create_dataset(task, seed=7, size=2)
        rows = reasoning_gym_rows(f"reasoning_gym:{task}?test_size=2&size=1", "test")
    entries = list(package)
    assert [entry_from_json(entry_to_json({"task": task, "entry": e}))["entry"] for e in entries] == entries
    batch = batch_from_scores(
        torch.zeros(len(rows)),
        columns={"completions": [r["answer"] for r in rows], "reasoning_gym": [r["reasoning_gym"] for r in rows]},
    )
    reward = ReasoningGymScore()
    scores = reward(batch).tolist()
    if task in NO_GOLD_ANSWER:
        assert [r["answer"] for r in rows] == ["None", "None"]
    else:
        assert scores == [1.0] * len(rows)
    assert reward.last_metrics["reward/scorer_error_frac"].item() == 0.0


def test_a_scorer_that_raises_scores_zero_and_is_counted():
    """prime_factorization's scorer raises ValueError on free text; the rest of the batch is scored."""
    from components.reward import ReasoningGymScore
    from lightning_rl.data.sources import load_rows

    rows = load_rows("reasoning_gym:prime_factorization?size=1&test_size=2", "test").to_list()
    completions = [
        rows[0]["answer"],
        "the factors are two and three",
        f"  {rows[1]['answer']}\n",
    ]  # whitespace stripped
    batch = batch_from_scores(
        torch.zeros(3),
        columns={
            "completions": completions,
            "reasoning_gym": [rows[0]["reasoning_gym"], *(r["reasoning_gym"] for r in rows)],
        },
    )
    reward = ReasoningGymScore()
    with pytest.warns(UserWarning, match=r"the prime_factorization scorer raised ValueError: .* such samples score 0"):
        assert reward(batch).tolist() == [1.0, 0.0, 1.0]
    torch.testing.assert_close(reward.score(batch).metrics["reward/scorer_error_frac"], torch.tensor(1 / 3))


def test_entries_keep_their_types():
    entry = {
        "grid": ((1, 2), (3, 4)),
        "cells": {(0, 1): "x"},
        "seen": {3},
        "frozen": frozenset({"a"}),
        "list": [(1,)],
        "tagged": {"__tuple__": [1]},
        "n": None,
        "f": 0.1,
        "b": True,
    }
    assert entry_from_json(entry_to_json({"task": "t", "entry": entry})) == {"task": "t", "entry": entry}
    with pytest.raises(TypeError, match=r"entry\['when'\] is a datetime.date, which cannot be stored as text"):
        import datetime

        entry_to_json({"task": "t", "entry": {"when": datetime.date(2026, 1, 1)}})
