"""`lightning_rl.Trainer` / `lightning_rl.fit`: composing in Python gives the Trainer `lightning-rl fit` builds."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

import lightning_rl
from lightning_rl.callbacks.progress import RLProgressBar
from lightning_rl.checkpoint import AtomicCheckpointIO
from lightning_rl.cli import DEFAULT_TRAINER_CONFIG, main

REPO = Path(__file__).parents[2]


def _settings(trainer) -> dict:
    (checkpoint,) = [c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)]
    logger = trainer.logger
    return {
        "max_steps": trainer.max_steps,
        "val_check_interval": trainer.val_check_interval,
        "log_every_n_steps": trainer.log_every_n_steps,
        "check_val_every_n_epoch": trainer.check_val_every_n_epoch,
        "num_sanity_val_steps": trainer.num_sanity_val_steps,
        "model_summary": any(type(c).__name__.endswith("ModelSummary") for c in trainer.callbacks),
        "bar": type(trainer.progress_bar_callback),
        "checkpoint_io": type(trainer.strategy.checkpoint_io),
        "logger": (type(logger), logger.name, logger.save_dir, logger._default_hp_metric),
        "checkpoint": (
            checkpoint.dirpath,
            checkpoint.save_last,
            checkpoint._every_n_train_steps,
            checkpoint.save_top_k,
        ),
        "root": trainer.default_root_dir,
    }


def test_the_python_trainer_is_the_one_the_cli_builds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(
        "TTY_COMPATIBLE", "1"
    )  # a terminal's bar (in a log file: lightning_rl.callbacks.progress.LineProgress)
    cli = main(
        ["--config", DEFAULT_TRAINER_CONFIG, "--config", str(REPO / "configs" / "grpo.yaml")], run=False
    )  # a run named grpo
    python = lightning_rl.Trainer(name="grpo")
    assert _settings(python) == _settings(cli.trainer)
    assert _settings(python)["bar"] is RLProgressBar and _settings(python)["checkpoint_io"] is AtomicCheckpointIO
    assert _settings(python)["logger"] == (TensorBoardLogger, "grpo", "runs", False)
    # the CLI's seed: the default of `seed`
    assert (
        inspect.signature(lightning_rl.Trainer).parameters["seed"].default
        == yaml.safe_load(open(DEFAULT_TRAINER_CONFIG))["seed_everything"]
    )


def test_arguments_override_the_defaults_and_the_bar_can_be_off_or_replaced(tmp_path, monkeypatch):
    from lightning.pytorch.callbacks import TQDMProgressBar

    monkeypatch.chdir(tmp_path)
    trainer = lightning_rl.Trainer(max_steps=7, enable_progress_bar=False, logger=False)
    assert trainer.max_steps == 7 and trainer.progress_bar_callback is None and trainer.logger is None
    assert isinstance(
        lightning_rl.Trainer(callbacks=TQDMProgressBar()).progress_bar_callback, TQDMProgressBar
    )  # theirs, not a second


@pytest.mark.slow
def test_fit_links_the_tokenizer_and_a_checkpoint_through_latest_continues_its_run(
    tmp_path, tiny_model_path, monkeypatch
):
    from lightning_rl import ModelSpec, PromptDataModule, RLModule

    monkeypatch.chdir(tmp_path)

    def module_and_data():
        return RLModule(policy=ModelSpec(path=tiny_model_path)), PromptDataModule(batch_size=2, val_size=4)

    trainer = lightning_rl.fit(*module_and_data(), name="mine", max_steps=2, enable_progress_bar=False)
    assert trainer.datamodule.hparams.tokenizer == tiny_model_path  # the CLI's link from model.policy.path
    latest = tmp_path / "runs" / "mine" / "latest" / "checkpoints" / "last.ckpt"
    trainer = lightning_rl.fit(
        *module_and_data(), ckpt_path=str(latest), name="mine", max_steps=3, enable_progress_bar=False
    )
    assert [p.name for p in (tmp_path / "runs" / "mine").glob("version_*")] == ["version_0"]  # the same run, continued
    assert trainer.global_step == 3 and torch.load(latest, weights_only=False)["global_step"] == 3
