"""configs/logger/*.yaml: the W&B and MLflow fragments name a real logger with arguments it takes, and (where the
package is installed) a short fit logs offline through them."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
import yaml

from lightning_rl.cli import DEFAULT_TRAINER_CONFIG, main
from tests.lightning_rl.cli_runs import cli_args

FRAGMENTS = sorted((Path(__file__).parents[3] / "configs" / "logger").glob("*.yaml"))


@pytest.mark.parametrize("fragment", FRAGMENTS, ids=lambda p: p.stem)
def test_fragment_names_a_logger_with_arguments_it_takes(fragment):
    logger = yaml.safe_load(fragment.read_text())["trainer"]["logger"]
    module, name = logger["class_path"].rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    inspect.signature(cls).bind(**logger["init_args"])  # a misspelt or removed argument raises TypeError


def _fit(tmp_path, model_path, fragment, *extra):
    args = cli_args(tmp_path, model_path, 1, "--data.val_data=null", config="configs/grpo.yaml")
    args = [
        a for a in args if not a.startswith("--trainer.logger")
    ]  # the fragment's logger, not the test runs' TensorBoard
    cli = main(["--config", DEFAULT_TRAINER_CONFIG, *args, "--config", str(fragment), *extra], run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli


@pytest.mark.slow
def test_wandb_offline(tmp_path, tiny_model_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    fragment = next(f for f in FRAGMENTS if f.stem == "wandb")
    cli = _fit(
        tmp_path,
        tiny_model_path,
        fragment,
        "--trainer.logger.init_args.offline=true",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
    )
    cli.trainer.logger.experiment.finish()
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    assert list(run.glob("*.wandb"))  # the run's records, for `wandb sync`
    assert (
        "reward/mean" in cli.trainer.logger.experiment.summary.keys() or list(run.glob("*.wandb"))[0].stat().st_size > 0
    )


@pytest.mark.slow
def test_mlflow_to_a_local_folder(tmp_path, tiny_model_path):
    pytest.importorskip("mlflow")
    fragment = next(f for f in FRAGMENTS if f.stem == "mlflow")
    cli = _fit(
        tmp_path, tiny_model_path, fragment, f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/mlflow.db"
    )
    logger = cli.trainer.logger
    metrics = logger.experiment.get_run(logger.run_id).data.metrics
    assert "reward/mean" in metrics and "time/rollout_s" in metrics


@pytest.mark.slow
def test_reruns_with_a_logger_without_folders_keep_their_checkpoints_apart(tmp_path, tiny_model_path):
    """MLflow on a database has no run folder: the checkpoints get versioned folders and a `latest` link of their own,
    so a rerun never writes last-v1.ckpt beside the first run's last.ckpt."""
    import torch

    pytest.importorskip("mlflow")
    fragment = next(f for f in FRAGMENTS if f.stem == "mlflow")
    for steps in (1, 2):
        args = [
            f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
            f"--trainer.max_steps={steps}",
            f"--trainer.callbacks.dirpath={tmp_path}/run/checkpoints",
        ]
        _fit(tmp_path, tiny_model_path, fragment, *args)
    run = tmp_path / "run"
    assert sorted(p.name for p in run.iterdir()) == ["latest", "version_0", "version_1"]
    assert torch.load(run / "latest" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2
    assert torch.load(run / "version_0" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 1
