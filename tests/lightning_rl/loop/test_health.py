"""Non-finite updates are skipped on every rank, counted, stop the run after a few in a row, and never reach a
checkpoint; a run that stopped learning says so once (lightning_rl.loop.health)."""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import pytest
import torch

from lightning_rl.callbacks import FiniteCheckpoints
from lightning_rl.core.errors import NonFiniteTrainingError
from lightning_rl.loop.health import TrainingHealth
from tests.lightning_rl.cli_runs import cli_args, run_cli, scalars

NAN = float("nan")
DENSE = [
    "--model.reward=components.reward.FunctionReward",
    "--model.reward.fn=tests.lightning_rl.rewards.digit_count",
    "--model.rollout.init_args.temperature=3.0",
    "--model.rollout.init_args.group_size=4",
    "--data.val_data=null",
]


def test_finite_step_skips_counts_and_stops_after_the_configured_streak():
    health = TrainingHealth(max_nonfinite_steps=3, degenerate_patience=0, min_entropy=0)
    with pytest.warns(UserWarning, match="skipped \\(1 in a row\\)"):
        assert not health.finite_step([torch.tensor(1.0), torch.tensor(NAN)], lr=1e-4)
    assert health.finite_step([torch.tensor(2.0), torch.tensor(0.5)], lr=1e-4)  # a good step resets the streak
    assert health.nonfinite_streak == 0
    with pytest.warns(UserWarning):
        assert not health.finite_step([torch.tensor(math.inf)], lr=1e3)
        assert not health.finite_step([torch.tensor(-math.inf)], lr=1e3)
    with pytest.raises(NonFiniteTrainingError, match=r"3 optimizer steps in a row.*model\.optimizer\.lr=1000.*reward"):
        health.finite_step([torch.tensor(NAN)], lr=1e3)


def test_checkpoint_with_non_finite_weights_is_refused():
    trainer, module = SimpleNamespace(global_step=7), SimpleNamespace(device=torch.device("cpu"))
    FiniteCheckpoints().on_save_checkpoint(
        trainer, module, {"state_dict": {"w": torch.ones(3), "steps": torch.tensor([1])}}
    )
    with pytest.raises(NonFiniteTrainingError, match="step 7: 1 weight tensor.*policy.w.*previous checkpoint is kept"):
        FiniteCheckpoints().on_save_checkpoint(trainer, module, {"state_dict": {"policy.w": torch.tensor([1.0, NAN])}})


def test_divergence_is_warned_once_with_what_to_try():
    health = TrainingHealth(max_nonfinite_steps=3, degenerate_patience=2, min_entropy=0.01)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        health.observe({"sampling/zero_var_groups": 1.0, "policy/entropy": 0.5}, 1)
        health.observe({"sampling/zero_var_groups": 0.5}, 2)  # the streak restarts
        health.observe({"sampling/zero_var_groups": 1.0}, 3)
        assert not caught
        for i in range(4, 8):
            health.observe({"sampling/zero_var_groups": 1.0, "policy/entropy": 0.001}, i)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2  # each said once
    assert (
        "iteration 4: every group has been degenerate" in messages[0]
        and "2 iterations in a row" in messages[0]
        and "model.optimizer.lr" in messages[0]
    )
    assert "entropy fell to 0.001" in messages[1] and "EntropyBonus" in messages[1]


@pytest.mark.slow
def test_nan_update_is_skipped_and_a_nan_streak_stops_the_run_with_finite_checkpoints(tmp_path, tiny_model_path):
    """Iteration 2's loss is NaN: its step is skipped (logged as health/skipped_nonfinite), the weights stay finite and
    training goes on. Then NaN from iteration 2 on: the third skip in a row stops the run naming the LR, and last.ckpt
    (iteration 3: its skipped iterations completed) holds the finite weights of iteration 1."""

    def nan(calls: str) -> list[str]:
        return ["--model.surrogate=tests.lightning_rl.fault_parts.NaNSurrogate", f"--model.surrogate.nan_calls={calls}"]

    run = run_cli("fit", cli_args(tmp_path / "one", tiny_model_path, 3, *DENSE, *nan("[2]")))
    skipped = dict(scalars(tmp_path / "one")["health/skipped_nonfinite"])
    assert skipped == {0: 0.0, 1: 1.0, 2: 0.0}
    assert run.trainer.global_step == 3 and run.model.loop_state.optimizer_steps["policy"] == 2
    saved = torch.load(tmp_path / "one" / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 3 and all(
        torch.isfinite(v).all() for v in saved["state_dict"].values() if v.is_floating_point()
    )

    with pytest.raises(NonFiniteTrainingError, match="model.optimizer.lr=0.0001"):
        run_cli(
            "fit",
            cli_args(
                tmp_path / "streak",
                tiny_model_path,
                6,
                *DENSE,
                *nan("[2, 3, 4, 5, 6]"),
                "--trainer.callbacks.every_n_train_steps=1",
            ),
        )
    saved = torch.load(tmp_path / "streak" / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 3 and saved["optimizer_steps"]["policy"] == 1
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values() if v.is_floating_point())
