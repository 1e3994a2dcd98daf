"""A reward that raises on some rows: one line naming the reward, the row and the option to go on (``on_failure``), or,
with ``on_failure: score``, those rows scored ``failure_score`` and counted in ``reward/error_frac``. And the columns a
TRL-style reward function reads, from its signature."""

from __future__ import annotations

import pytest
import torch

from components.reward import Composite, ExactMatch, FunctionReward, PooledReward, ResultScore
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.errors import RewardError


def rows(prompts: list[str], completions: list[str], **columns: list) -> RolloutBatch:
    n = len(prompts)
    return RolloutBatch(
        response_ids=torch.ones(n, 2, dtype=torch.long),
        response_mask=torch.ones(n, 2, dtype=torch.long),
        columns={"prompts": prompts, "prompt": prompts, "completions": completions, **columns},
    )


BATCH = rows(["1+1=", "2+2=", "3+3=", "4+4="], ["2", "4", "5", "8"], answer=["2", "4", "6", "8"])


class Counted:
    """``fn(prompts, completions, answer)``: exact match, raising for a batch holding ``bad`` prompts; counts its calls."""

    def __init__(self, bad: set[str]):
        self.bad, self.calls = bad, []

    def __call__(self, prompts, completions, answer, **kwargs):
        self.calls.append(list(prompts))
        hit = [p for p in prompts if p in self.bad]
        if hit:
            raise ValueError(f"cannot parse {hit[0]!r}")
        return [float(c == a) for c, a in zip(completions, answer)]


def test_a_reward_function_declares_the_data_columns_it_reads_from_its_signature():
    def trl(prompts, completions, solution, difficulty, **kwargs): ...

    def optional(prompts, completions, solution, source="web", **kwargs): ...

    def agent(completions, transcripts, result, answer): ...

    assert FunctionReward(trl).data_columns() == {"solution", "difficulty"}
    assert FunctionReward(trl, kwargs={"difficulty": 3}).data_columns() == {"solution"}  # given on every call
    assert FunctionReward(optional).data_columns() == {"solution"}  # a default: not required of the data
    assert FunctionReward(agent).data_columns() == {"answer"}  # the loop's and an agent's columns are not the data's
    assert PooledReward(trl).data_columns() == {"solution", "difficulty"}
    assert FunctionReward(len).data_columns() == frozenset()  # a signature Python cannot read: nothing checked


def test_a_function_without_kwargs_gets_only_the_columns_it_names():
    seen = {}

    def strict(completions, answer):
        seen["names"] = ["completions", "answer"]
        return [float(c == a) for c, a in zip(completions, answer)]

    assert FunctionReward(strict).score(BATCH).total.tolist() == [1.0, 1.0, 0.0, 1.0]
    assert seen  # called without prompts / prompt, which it does not take


def test_a_batch_function_that_raises_is_called_again_row_by_row_and_the_first_failing_row_is_one_line():
    fn = Counted(bad={"3+3=", "4+4="})
    with pytest.raises(RewardError) as raised:
        FunctionReward(fn).score(BATCH)
    line = str(raised.value)
    assert "\n" not in line
    assert line.startswith(
        "reward FunctionReward(tests.components.test_reward_failures.Counted) failed at row 2 of 4 "
        "(prompt '3+3=', completion '5'): ValueError: cannot parse '3+3='; set on_failure: score on this reward"
    )
    assert "reward/error_frac" in line
    # the batch once, then rows 0, 1, 2 alone: the first that raises ends the search
    assert fn.calls == [["1+1=", "2+2=", "3+3=", "4+4="], ["1+1="], ["2+2="], ["3+3="]]


def test_on_failure_score_gives_failing_rows_the_failure_score_and_counts_them():
    fn = Counted(bad={"3+3="})
    scored = FunctionReward(fn, on_failure="score", failure_score=-1.0).score(BATCH)
    assert scored.total.tolist() == [1.0, 1.0, -1.0, 1.0]  # row 3 (4+4=8) still scored by the function
    assert scored.metrics["reward/error_frac"].item() == 0.25
    # a batch that does not raise: counted 0, so the curve exists from the first iteration
    clean = FunctionReward(Counted(bad=set()), on_failure="score").score(BATCH)
    assert clean.total.tolist() == [1.0, 1.0, 0.0, 1.0] and clean.metrics["reward/error_frac"].item() == 0.0
    # without on_failure: score there is no such curve (the run stops instead)
    assert "reward/error_frac" not in FunctionReward(Counted(bad=set())).score(BATCH).metrics


def test_a_row_that_returns_no_finite_number_is_a_failing_row():
    def nan_on_three(prompts, completions, **kwargs):
        return [float("nan") if p == "3+3=" else 1.0 for p in prompts]

    with pytest.raises(RewardError, match=r"failed at row 2 of 4 \(prompt '3\+3=', completion '5'\): it returned nan"):
        FunctionReward(nan_on_three).score(BATCH)
    scored = FunctionReward(nan_on_three, on_failure="score", failure_score=0.5).score(BATCH)
    assert scored.total.tolist() == [1.0, 1.0, 0.5, 1.0] and scored.metrics["reward/error_frac"].item() == 0.25


def test_a_batch_error_that_no_row_repeats_is_raised_as_the_batchs_whatever_on_failure():
    def one_score(completions, **kwargs):  # a bug, not a bad row: every row alone is fine
        return [1.0]

    for on_failure in ("raise", "score"):
        with pytest.raises(RewardError, match=r"must return 4 scores.*\(on the batch of 4 rows; on no row alone\)"):
            FunctionReward(one_score, on_failure=on_failure).score(BATCH)


def test_a_composites_parts_each_apply_their_own_on_failure():
    failing = FunctionReward(Counted(bad={"1+1="}), on_failure="score", failure_score=-1.0)
    scored = Composite([ExactMatch(), failing], weights=[1.0, 0.5], names=["exact", "fn"]).score(BATCH)
    assert scored.parts["fn"].tolist() == [-1.0, 1.0, 0.0, 1.0]
    assert scored.total.tolist() == [1.0 - 0.5, 1.5, 0.0, 1.5]
    assert scored.metrics["reward/error_frac"].item() == 0.25
    strict = Composite([ExactMatch(), FunctionReward(Counted(bad={"1+1="}))])
    with pytest.raises(RewardError, match=r"failed at row 0 of 4 \(prompt '1\+1='"):
        strict.score(BATCH)


def test_every_reward_that_reads_rows_takes_the_options():
    """A built-in reward's own failure (an agent's result without a number) follows the same option."""
    results = rows(["a", "b"], ["x", "y"], result=[{"reward": 1.0}, {"score": 2.0}])
    with pytest.raises(
        RewardError, match=r"reward ResultScore failed at row 1 of 2 .*: ValueError: ResultScore: row 0"
    ):
        ResultScore().score(results)
    scored = ResultScore(on_failure="score", failure_score=-2.0).score(results)
    assert scored.total.tolist() == [1.0, -2.0] and scored.metrics["reward/error_frac"].item() == 0.5
    with pytest.raises(ValueError, match="on_failure must be raise or score, got 'skip'"):
        ExactMatch(on_failure="skip")
