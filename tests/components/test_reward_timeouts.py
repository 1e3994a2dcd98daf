"""A reward that never returns cannot hang the run: FunctionReward has a per-call timeout, PooledReward a per-sample
one with a score (or a hard failure) for samples that time out or raise, and runs slow rewards in parallel."""

from __future__ import annotations

import time

import pytest
import torch

from components.reward import FunctionReward, PooledReward
from lightning_rl.core.errors import RewardError
from tests.helpers import batch_from_scores
from tests.lightning_rl.rewards import hangs_on_x, sleepy_length


def inputs(completions: list[str]):
    return batch_from_scores([0.0] * len(completions)).replace(
        columns={"prompts": ["p"] * len(completions), "completions": completions}
    )


def test_function_reward_that_never_returns_fails_after_its_timeout():
    batch = inputs(["ab", "x"])
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"did not return within timeout_s=0.3 s for 2 samples.*PooledReward"):
        FunctionReward(hangs_on_x, timeout_s=0.3)(batch)
    assert time.monotonic() - start < 2.0
    assert FunctionReward(hangs_on_x, timeout_s=0.3)(inputs(["ab", "cd"])).tolist() == [1.0, 1.0]


def test_pooled_reward_scores_timeouts_and_errors_and_logs_their_fractions():
    reward = PooledReward(hangs_on_x, workers=2, timeout_s=0.5, failure_score=-1.0)
    try:
        start = time.monotonic()
        scores = reward(inputs(["ab", "x", "e", "cd"]))
        assert time.monotonic() - start < 4.0  # one sample hangs forever; the run goes on after its timeout
        assert scores.tolist() == [1.0, -1.0, -1.0, 1.0]
        assert {k: float(v) for k, v in reward.last_metrics.items()} == {
            "reward/timeout_frac": 0.25,
            "reward/error_frac": 0.25,
        }
        assert reward(inputs(["ab"])).tolist() == [1.0]  # the pool still works
    finally:
        reward.close()


def test_pooled_reward_hard_failure_names_the_sample():
    reward = PooledReward(hangs_on_x, workers=2, timeout_s=0.3, on_failure="raise")
    try:
        with pytest.raises(
            RewardError, match=r"at row 1 of 2 \(prompt 'p', completion 'x'\): it took longer than timeout_s=0.3 s"
        ):
            reward(inputs(["ab", "x"]))
        with pytest.raises(RewardError, match=r"at row 0 of 1 .*: ValueError: sandbox crashed; set on_failure: score"):
            reward(inputs(["e"]))
    finally:
        reward.close()


def test_pool_runs_a_slow_reward_in_parallel_with_the_same_scores():
    """50 ms per sample, 32 samples: sequentially ~1.6 s, over 8 workers ~0.2 s (measured ratio printed)."""
    batch = inputs([f"c{'d' * i}" for i in range(32)])
    reward = PooledReward(sleepy_length, workers=8, timeout_s=5.0)
    try:
        reward(inputs(["warm"] * 8))  # the workers start once per run
        start = time.monotonic()
        pooled = reward(batch)
        pooled_s = time.monotonic() - start
        start = time.monotonic()
        serial = FunctionReward(sleepy_length)(batch)
        serial_s = time.monotonic() - start
    finally:
        reward.close()
    torch.testing.assert_close(pooled, serial)
    print(
        f"PooledReward speed-up at 50 ms/sample, 32 samples, 8 workers: {serial_s / pooled_s:.1f}x ({serial_s:.2f} s -> {pooled_s:.2f} s)"
    )
    assert serial_s / pooled_s > 3.0
