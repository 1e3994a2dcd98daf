"""Each fit gets its own run folder; runs/<name>/latest always reaches the newest run's final state."""

import re
import warnings

import pytest
import torch

from lightning_rl.cli import DEFAULT_TRAINER_CONFIG, main

from .cli_runs import cli_args


def _fit(root, model_path, steps):
    args = cli_args(root, model_path, steps, "--data.val_data=null", f"--trainer.callbacks.dirpath={root}/run/checkpoints")
    cli = main(["--config", DEFAULT_TRAINER_CONFIG, *args], run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)


@pytest.mark.slow
def test_a_rerun_gets_its_own_folder_and_latest_follows_it(tmp_path, tiny_model_path):
    _fit(tmp_path, tiny_model_path, 2)
    _fit(tmp_path, tiny_model_path, 3)
    run = tmp_path / "run"
    assert sorted(p.name for p in run.iterdir()) == ["latest", "version_0", "version_1"]
    assert (run / "latest").resolve() == (run / "version_1").resolve()
    assert torch.load(run / "latest" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 3  # the second run's
    assert torch.load(run / "version_0" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2  # the first run kept
    assert not (run / "checkpoints").exists()
    assert (run / "version_1" / "config.yaml").exists()  # the resolved config beside its checkpoints and events


@pytest.mark.slow
def test_validation_before_after_and_validate_beside_its_fit(tmp_path, tiny_model_path, capsys):
    from .cli_runs import run_cli, scalars

    args = cli_args(tmp_path, tiny_model_path, 3, f"--trainer.callbacks.dirpath={tmp_path}/run/checkpoints")  # validates every 2
    run_cli("fit", args)
    logged = scalars(tmp_path)
    assert [step for step, _ in logged["val/reward"]] == [0, 2, 3]  # before training, every 2, after the last
    assert "epoch" not in logged and "hp_metric" not in logged
    assert {"time/rollout_s", "time/score_s"} <= set(logged)  # units in the names
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run" / "version_0"), size_guidance={"tensors": 0})
    events.Reload()
    assert "custom_scalars__config__" in events.Tags()["tensors"]  # the Custom Scalars tab: reward, val, policy, cost
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_cli("validate", [*args, f"--ckpt_path={tmp_path}/run/latest/checkpoints/last.ckpt"])
    assert not [w for w in caught if "dirpath has changed" in str(w.message)]  # the run's own folder is no news
    printed = capsys.readouterr().out  # `validate` prints and returns what it measured, though Lightning did not log it
    assert re.search(r"val/reward\s+│\s+\d\.\d+", printed) and re.search(r"val/response_length\s+│\s+\d", printed)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["latest", "version_0"]  # no run of its own
    assert [step for step, _ in scalars(tmp_path)["val/reward"]] == [0, 2, 3, 3]  # beside the fit, at its step
