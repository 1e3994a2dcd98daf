"""Run folders: every `fit` writes into its own versioned folder, and ``<save_dir>/<name>/latest`` points at the newest.

TensorBoard's logger already versions its events (``runs/grpo/version_3``); the checkpoints of a preset
(``runs/grpo/checkpoints``) were shared by every run, so a second `fit` wrote ``last-v1.ckpt`` beside the
first run's ``last.ckpt``. Here a checkpoint folder at ``<save_dir>/<name>/checkpoints`` moves into the
run's own folder, beside its events and resolved config, and ``latest`` links to that folder, so
``runs/grpo/latest/checkpoints/last.ckpt`` is always the newest run's final state. Old runs are kept.
``validate`` on such a checkpoint writes its points into that run's folder (`log_into_run`). With a logger that
has no versioned folder (W&B, MLflow), a checkpoint folder named ``checkpoints`` gets the same treatment on its
own: ``<parent>/version_N/checkpoints`` and ``<parent>/latest``. Without a logger the folder is left as given.
"""

from __future__ import annotations

import os
from pathlib import Path

from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint


class RunFolders(Callback):
    """Checkpoints into the logger's versioned folder; a ``latest`` link beside the versions."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        logger = trainer.logger
        root = Path(logger.save_dir) / logger.name if logger is not None and getattr(logger, "save_dir", None) and logger.name else None
        run = Path(trainer.log_dir) if trainer.log_dir is not None else None  # runs/grpo/version_N (rank 0's, broadcast)
        if logger is None:
            return  # no run tracking asked for: the checkpoint folder is the user's, as given
        if root is None or run is None or run.parent.resolve() != root.resolve():
            self._version_checkpoints(trainer)  # a logger without versioned folders (W&B, MLflow)
            return
        for checkpoint in _checkpoints(trainer):
            # only the preset layout moves; a dirpath the user chose elsewhere is theirs
            if checkpoint.dirpath is not None and Path(checkpoint.dirpath).resolve() == (root / "checkpoints").resolve():
                checkpoint.dirpath = str(run / "checkpoints")
        if trainer.is_global_zero:
            _link_latest(root, run)

    @staticmethod
    def _version_checkpoints(trainer) -> None:
        for checkpoint in _checkpoints(trainer):
            folder = Path(checkpoint.dirpath) if checkpoint.dirpath is not None else None
            if folder is None or folder.name != "checkpoints":
                continue
            root = folder.parent
            version = trainer.strategy.broadcast(_next_version(root) if trainer.is_global_zero else None)
            run = root / f"version_{version}"
            checkpoint.dirpath = str(run / "checkpoints")
            if trainer.is_global_zero:
                _link_latest(root, run)


def _checkpoints(trainer) -> list[ModelCheckpoint]:
    return [c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)]


def _next_version(root: Path) -> int:
    """One past the highest ``version_N`` under ``root`` (0 for none), as TensorBoard's logger numbers its folders."""
    versions = [int(p.name.removeprefix("version_")) for p in root.glob("version_*") if p.name.removeprefix("version_").isdigit()]
    return max(versions, default=-1) + 1


def _link_latest(root: Path, run: Path) -> None:
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
