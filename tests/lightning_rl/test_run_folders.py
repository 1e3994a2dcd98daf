"""Each fit gets its own run folder; runs/<name>/latest always reaches the newest run's final state."""

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
