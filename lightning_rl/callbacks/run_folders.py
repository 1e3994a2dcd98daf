"""`RunFolders`: each fit's checkpoints in its run's folder, and ``latest/`` linked to the newest run
(lightning_rl.runs says how the folders are laid out and chosen)."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import Callback

from lightning_rl.runs import checkpoint_callbacks, claim_version, follows_run, is_version, link_latest, versioned


class RunFolders(Callback):
    """Checkpoints into the run's folder; a ``latest`` folder of links beside the versions (see the module's doc)."""

    def __init__(self) -> None:
        self._run: Path | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit" or trainer.logger is None:
            return  # no run tracking asked for: the checkpoint folder is the user's, as given
        logger = trainer.logger
        if versioned(logger):
            run = Path(trainer.log_dir)  # runs/grpo/version_N, rank 0's (broadcast)
            for checkpoint in checkpoint_callbacks(trainer):
                if follows_run(checkpoint.dirpath, logger):
                    checkpoint.dirpath = str(run / "checkpoints")
        else:  # a logger without versioned folders (W&B, MLflow): the checkpoint folder gets the versions
            run = None
            for checkpoint in checkpoint_callbacks(trainer):
                if checkpoint.dirpath is None or Path(checkpoint.dirpath).name != "checkpoints":
                    continue
                folder = Path(checkpoint.dirpath)
                chosen = None
                if trainer.is_global_zero:  # start_run claimed it already under the CLI; in Python, claimed here
                    chosen = str(folder if is_version(folder.parent) else claim_version(folder.parent) / "checkpoints")
                checkpoint.dirpath = trainer.strategy.broadcast(chosen)
                run = Path(checkpoint.dirpath).parent
        self._run = run

    def on_train_start(self, trainer, pl_module) -> None:
        # not at setup: a --ckpt_path through latest/ (Trainer.fit in Python) is read after setup, and must still find it
        if self._run is not None and trainer.is_global_zero:
            link_latest(self._run)
