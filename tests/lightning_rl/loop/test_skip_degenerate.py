"""skip_degenerate_batches skips an update only when nothing in the loss has a gradient."""

import warnings
from types import SimpleNamespace

import pytest
import torch

from components.kl import KLRegularizer
from components.loss_terms import EntropyBonus, PositiveNLL
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.config import LoopConfig
from lightning_rl.loop.optimize import PolicyUpdate


def _degenerate_batch(scores):
    return RolloutBatch(
        response_ids=torch.zeros(2, 3, dtype=torch.long),
        response_mask=torch.ones(2, 3),
        advantages=torch.zeros(2, 3),  # every group degenerate
        scores=torch.tensor(scores),
    )


@pytest.mark.parametrize(
    "kl, terms, scores, expected",
    [
        (None, [], [0.0, 0.0], False),
        (
            KLRegularizer(coef=0.04, placement="loss"),
            [],
            [0.0, 0.0],
            True,
        ),  # the KL term still pulls toward the reference
        (
            KLRegularizer(coef=0.05, placement="reward"),
            [],
            [0.0, 0.0],
            False,
        ),  # in the reward it reaches the loss only via A
        (None, [PositiveNLL(coef=0.1)], [1.0, 1.0], True),  # all-correct group: the NLL on positives has a gradient
        (None, [PositiveNLL(coef=0.1)], [0.0, 0.0], False),  # all wrong: no positive sample, no gradient
        (None, [EntropyBonus(coef=0.001)], [0.0, 0.0], True),
        (None, [EntropyBonus(coef=0.0)], [0.0, 0.0], False),
    ],
    ids=["nothing", "kl-in-loss", "kl-in-reward", "positive-nll", "positive-nll-no-positive", "entropy", "entropy-0"],
)
def test_skip_only_without_any_gradient(kl, terms, scores, expected):
    update = SimpleNamespace(
        loop=LoopConfig(skip_degenerate_batches=True),
        critic=None,
        kl=kl,
        loss_terms=terms,
        ptx=None,
        _said_degenerate=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert PolicyUpdate.worth_optimizing(update, _degenerate_batch(scores), 0) is expected


def test_a_pretraining_loss_is_a_gradient_too():
    # PPO-ptx mixes gamma x NLL of the pretraining text into the policy loss: a batch whose every group is degenerate
    # still has it, so the update runs
    from components.ptx import PretrainMix

    update = SimpleNamespace(
        loop=LoopConfig(skip_degenerate_batches=True),
        critic=None,
        kl=None,
        loss_terms=[],
        ptx=PretrainMix(coef=0.5),
        _said_degenerate=False,
    )
    assert PolicyUpdate.worth_optimizing(update, _degenerate_batch([0.0, 0.0]), 0) is True
    update.ptx = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert PolicyUpdate.worth_optimizing(update, _degenerate_batch([0.0, 0.0]), 0) is False


@pytest.mark.slow
def test_skipped_updates_are_counted_in_a_metric_and_said_once(tmp_path, tiny_model_path):
    from tests.lightning_rl.cli_runs import cli_args, run_cli, scalars

    args = cli_args(
        tmp_path,
        tiny_model_path,
        3,
        "--data.val_data=null",
        "--model.reward=components.reward.FunctionReward",
        "--model.reward.fn=tests.lightning_rl.rewards.always_zero",
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_cli("fit", args)
    said = [w for w in caught if "every advantage is zero" in str(w.message)]
    assert len(said) == 1 and "health/skipped_degenerate" in str(said[0].message)
    assert [value for _, value in scalars(tmp_path)["health/skipped_degenerate"]] == [1.0, 1.0, 1.0]
