"""KLRegularizer(refresh_every=N): the reference becomes the current policy every N iterations, and checkpoints carry it."""

import pytest
import torch

from components.kl import KLRegularizer
from lightning_rl.cli import DEFAULT_TRAINER_CONFIG, main
from tests.lightning_rl.cli_runs import cli_args


def _fit(tmp_path, tiny_model_path, *extra):
    args = cli_args(
        tmp_path,
        tiny_model_path,
        2,
        "--data.batch_size=4",
        "--model.reward=components.reward.FunctionReward",
        "--model.reward.fn=tests.lightning_rl.rewards.digit_count",
        "--model.optimizer.lr=1e-2",
        *extra,
        config="configs/grpo_deepseekmath.yaml",
    )
    cli = main(["--config", DEFAULT_TRAINER_CONFIG, *args], run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli.model


def _same(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.slow
def test_reference_follows_the_policy_every_n_iterations(tmp_path, tiny_model_path):
    refreshed = _fit(tmp_path / "a", tiny_model_path, "--model.kl.init_args.refresh_every=1")
    assert _same(refreshed.reference, refreshed.policy)
    saved = torch.load(tmp_path / "a" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)[
        "state_dict"
    ]
    assert any(k.startswith("reference.") for k in saved)  # the moved anchor is state now
    fixed = _fit(tmp_path / "b", tiny_model_path)
    assert not _same(fixed.reference, fixed.policy)
    saved = torch.load(tmp_path / "b" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)[
        "state_dict"
    ]
    assert not any(k.startswith("reference.") for k in saved)  # reloaded from its path


def test_refresh_schedule():
    kl = KLRegularizer(coef=0.04, refresh_every=3)
    assert [kl.refresh_due(i) for i in range(1, 7)] == [False, False, True, False, False, True]
    assert not KLRegularizer(coef=0.0, refresh_every=1).refresh_due(1)  # no KL, no reference to refresh
    with pytest.raises(ValueError, match="refresh_every must be >= 1"):
        KLRegularizer(coef=0.04, refresh_every=0)


@pytest.mark.slow
def test_refresh_every_two_happens_after_the_second_iteration_not_the_first(tmp_path, tiny_model_path):
    # one optimizer step per iteration: after 2 iterations with refresh_every 2 the reference is the final policy
    # (a refresh after iteration 1 would leave it one update behind)
    refreshed = _fit(tmp_path, tiny_model_path, "--model.kl.init_args.refresh_every=2")
    assert _same(refreshed.reference, refreshed.policy)
