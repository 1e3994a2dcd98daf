"""Sizes and learning rates that cannot run fail at construction, naming the config key (not a hang or a ZeroDivisionError)."""

from __future__ import annotations

import pytest

from components.advantage import GroupNormalized, LeaveOneOut, ReinforceBaseline, ReinforcePlusPlus
from components.rollout import HFRollout
from lightning_rl.core.config import LoopConfig, OptimizerConfig
from lightning_rl.data.prompts import PromptDataModule
from lightning_rl.loop.module import RLModule


@pytest.mark.parametrize(
    "key, value",
    [("batch_size", -2), ("batch_size", 0), ("val_batch_size", 0), ("max_prompt_length", 0), ("val_size", 0)],
)
def test_data_sizes(key, value):
    with pytest.raises(ValueError, match=f"data.{key}={value} must be >= 1"):
        PromptDataModule(**{key: value})


@pytest.mark.parametrize("key", ["ppo_epochs", "num_mini_batches", "micro_batch_size", "forward_batch_size"])
def test_loop_sizes(key):
    with pytest.raises(ValueError, match=f"model.loop.{key}=0 must be >= 1"):
        LoopConfig(**{key: 0})


def test_a_token_budget_of_zero_fails_at_construction():
    with pytest.raises(ValueError, match=r"model.loop.max_tokens_per_micro_batch=0 must be >= 1 .* or null"):
        LoopConfig(max_tokens_per_micro_batch=0)  # before any model loads, not at the first forward
    LoopConfig(max_tokens_per_micro_batch=None)


@pytest.mark.parametrize("lr", [-1.0, float("nan"), float("inf")])
def test_learning_rate_must_be_finite_and_not_negative(lr):
    with pytest.raises(ValueError, match="model.optimizer.lr"):
        OptimizerConfig(lr=lr)
    OptimizerConfig(lr=0.0)  # a frozen group is allowed


@pytest.mark.parametrize(
    "advantage",
    [GroupNormalized(), GroupNormalized(scale="none"), LeaveOneOut(), ReinforcePlusPlus(group_baseline=True)],
)
def test_group_relative_estimator_with_a_group_of_one(advantage):
    with pytest.raises(ValueError, match=f"{type(advantage).__name__}.*group_size=1: every advantage would be 0"):
        RLModule(rollout=HFRollout(group_size=1), advantage=advantage)


@pytest.mark.parametrize("advantage", [ReinforceBaseline(), ReinforcePlusPlus()])
def test_estimators_without_groups_accept_a_group_of_one(advantage):
    RLModule(rollout=HFRollout(group_size=1), advantage=advantage)
