"""Run folders: every `fit` writes into its own versioned folder, and ``<save_dir>/<name>/latest`` points at the newest.

TensorBoard's logger already versions its events (``runs/grpo/version_3``); the checkpoints of a preset
(``runs/grpo/checkpoints``) were shared by every run, so a second `fit` wrote ``last-v1.ckpt`` beside the
first run's ``last.ckpt``. Here a checkpoint folder at ``<save_dir>/<name>/checkpoints`` moves into the
run's own folder, beside its events and resolved config, and ``latest`` links to that folder, so
``runs/grpo/latest/checkpoints/last.ckpt`` is always the newest run's final state. Old runs are kept.
``validate`` on such a checkpoint writes its points into that run's folder (`log_into_run`).
"""

from __future__ import annotations

import os
from pathlib import Path

from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint


class RunFolders(Callback):
    """Checkpoints into the logger's versioned folder; a ``latest`` link beside the versions."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        logger = trainer.logger
        if stage != "fit" or logger is None or getattr(logger, "save_dir", None) is None or not logger.name:
            return
        root = Path(logger.save_dir) / logger.name  # runs/grpo
        run = Path(trainer.log_dir)  # runs/grpo/version_N (rank 0's choice, broadcast)
        if run.parent.resolve() != root.resolve():  # a logger without versioned folders (W&B, MLflow): nothing to link
            return
        for checkpoint in (c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)):
            # only the preset layout moves; a dirpath the user chose elsewhere is theirs
            if checkpoint.dirpath is not None and Path(checkpoint.dirpath).resolve() == (root / "checkpoints").resolve():
                checkpoint.dirpath = str(run / "checkpoints")
        if trainer.is_global_zero:
            run.mkdir(parents=True, exist_ok=True)
            link = root / "latest"
            tmp = root / f".latest.tmp-{os.getpid()}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(run.name, target_is_directory=True)  # relative: the folder can move
            os.replace(tmp, link)  # atomic: a reader sees the old or the new run, never none


def log_into_run(trainer, ckpt_path: str | None) -> None:
    """For a checkpoint at ``<save_dir>/<name>/version_N/checkpoints/*.ckpt`` (``latest`` resolved), point a versioned
    logger of the same ``<save_dir>/<name>`` at ``version_N``, so validation lands beside the fit it evaluates.
    Call before the logger writes anything (its experiment is created lazily)."""
    if ckpt_path is None or "://" in str(ckpt_path):
        return
    checkpoint = Path(ckpt_path).resolve()
    run = checkpoint.parent.parent
    version = run.name.removeprefix("version_")
    if checkpoint.parent.name != "checkpoints" or not run.name.startswith("version_") or not version.isdigit():
        return
    for logger in trainer.loggers:
        fresh = getattr(logger, "_experiment", True) is None and hasattr(logger, "_version")
        if fresh and getattr(logger, "save_dir", None) and logger.name and (Path(logger.save_dir) / logger.name).resolve() == run.parent:
            logger._version = int(version)
