"""loop.target_kl stops the remaining PPO epochs of an iteration once an epoch's approx-KL exceeds it."""

import pytest

from lightning_rl.cli import DEFAULT_TRAINER_CONFIG, main
from tests.lightning_rl.cli_runs import cli_args


def _epochs_run(tmp_path, tiny_model_path, *extra) -> float:
    args = cli_args(
        tmp_path,
        tiny_model_path,
        3,
        "--data.batch_size=4",
        "--model.reward=components.reward.FunctionReward",
        "--model.reward.fn=tests.lightning_rl.rewards.digit_count",
        "--model.loop.ppo_epochs=4",
        "--model.loop.num_mini_batches=2",
        "--model.optimizer.lr=1e-2",
        *extra,
    )
    cli = main(["--config", DEFAULT_TRAINER_CONFIG, *args], run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return float(cli.trainer.callback_metrics["policy/epochs_run"]), float(
        cli.trainer.callback_metrics["policy/approx_kl"]
    )


@pytest.mark.slow
def test_target_kl_stops_the_epochs(tmp_path, tiny_model_path):
    # a dense reward (digit count) so every iteration has advantages; the first mini-batch of epoch 1 is on-policy (KL 0); the second runs after a step at lr 1e-2, so the
    # epoch's mean approx-KL is > 0 and a target of 1e-9 stops after epoch 1; without a target all 4 run
    epochs, kl = _epochs_run(tmp_path / "stop", tiny_model_path, "--model.loop.target_kl=1e-9")
    assert epochs == 1.0 and kl > 1e-9
    epochs, _ = _epochs_run(tmp_path / "all", tiny_model_path)
    assert epochs == 4.0


def test_the_epoch_kl_is_the_token_mean_of_that_epoch_alone():
    """The early-stopping criterion: approx-KL averaged over the epoch's tokens (each micro-batch's mean weighted by its
    token count), not their sum (which grows with the batch), nor including the epochs before it."""
    import torch

    from lightning_rl.loop.metrics import WeightedMeans
    from lightning_rl.loop.optimize import PolicyUpdate

    metrics = WeightedMeans()
    metrics.add("policy/approx_kl", torch.tensor(0.5), torch.tensor(10.0))  # an earlier epoch
    before = metrics.running("policy/approx_kl")
    metrics.add("policy/approx_kl", torch.tensor(0.01), torch.tensor(30.0))  # this epoch: two micro-batches
    metrics.add("policy/approx_kl", torch.tensor(0.03), torch.tensor(10.0))
    kl = PolicyUpdate._epoch_kl(metrics, before, torch.device("cpu"))
    assert kl == pytest.approx((0.01 * 30 + 0.03 * 10) / 40)  # 0.015; the sum is 0.6
