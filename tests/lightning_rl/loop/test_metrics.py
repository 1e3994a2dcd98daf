"""Iteration metrics: weighted means reduced in one stack, wherever their values were computed.

The meta device stands in for a GPU here: like CUDA, it takes part in arithmetic with CPU scalars but refuses to be
stacked with CPU tensors, which is what the reduction does.
"""

from __future__ import annotations

import pytest
import torch

from lightning_rl.loop.metrics import WeightedMeans


def test_host_values_join_the_accelerators_in_one_reduction():
    """The collect phase adds its wall-clock wait as a CPU tensor beside losses on the GPU: every sum must live on
    the module's device, or the reduction's stack fails at the end of the first iteration."""
    metrics = WeightedMeans(torch.device("meta"))
    metrics.add("time/rollout_wait_s", torch.tensor(0.5))
    metrics.add("policy/loss", torch.ones((), device="meta"), torch.tensor(3.0, device="meta"))
    metrics.add("reward/timeout_frac", torch.tensor(0.25), torch.tensor(4.0))  # a CPU reward's metric and weight
    metrics.add("rollout/logprob_diff_max", torch.tensor(2.0))
    metrics.add("rollout/logprob_diff_max", torch.ones((), device="meta"))
    out = metrics.compute(sync=False)
    assert sorted(out) == ["policy/loss", "reward/timeout_frac", "rollout/logprob_diff_max", "time/rollout_wait_s"]
    assert {v.device.type for v in out.values()} == {"meta"}


def test_the_means_are_weighted_and_maxima_kept():
    metrics = WeightedMeans("cpu")
    metrics.add("loss", torch.tensor(1.0), 3.0)
    metrics.add("loss", torch.tensor(5.0), torch.tensor(1.0))
    metrics.add("diff_max", torch.tensor(2.0))
    metrics.add("diff_max", torch.tensor(-1.0))
    out = metrics.compute(sync=False)
    assert float(out["loss"]) == pytest.approx(2.0) and float(out["diff_max"]) == 2.0
    torch.testing.assert_close(metrics.running("loss"), torch.tensor([8.0, 4.0]))
