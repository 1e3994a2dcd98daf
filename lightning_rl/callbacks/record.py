"""`RecordRollouts`: every batch a run trains, as it was trained, in the run's folder (``rollouts/``), written in the
background (lightning_rl.rollouts); ``record_rollouts: true`` in a config, ``--record_rollouts true`` on the command line.

`RLModule` hands it each iteration's batch once the advantages are estimated, before the update (so the iteration that
failed is recorded too); the writer's thread encodes and writes it while the update runs. A fit continued from a
checkpoint records into the same folder, from the checkpoint's iteration on (the files the interrupted fit wrote after
it are removed: they are trained again).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

from lightning import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_rl.rollouts import RecordedIteration, RolloutWriter
from lightning_rl.rollouts.record import start_session
from lightning_rl.runs import run_folder, shown_path

FOLDER = "rollouts"


@dataclass(eq=False)
class RecordRollouts(Callback):
    """Record the batches of every RL iteration into ``<run folder>/rollouts`` (lightning_rl.rollouts)."""

    keep_last: int | None = None
    """Keep the files of the newest N iterations only (None = every iteration)."""
    folder: Path | None = field(default=None, init=False)
    """Where this fit records, once set up."""

    def __post_init__(self) -> None:
        if self.keep_last is not None and self.keep_last < 1:
            raise ValueError(
                f"record_rollouts.keep_last={self.keep_last} must be >= 1 (or null to keep every iteration)"
            )
        self._writer: RolloutWriter | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        run = run_folder(trainer) if trainer.is_global_zero else None
        chosen = (
            str((run if run is not None else Path(trainer.default_root_dir)) / FOLDER)
            if trainer.is_global_zero
            else None
        )
        self.folder = Path(trainer.strategy.broadcast(chosen))

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            config = self.folder.parent / "config.yaml"
            start_session(self.folder, trainer.global_step, trainer.world_size, config if config.is_file() else None)
            rank_zero_info(f"Recording the rollouts of every iteration into {shown_path(self.folder)}")
        trainer.strategy.barrier()
        self._writer = RolloutWriter(self.folder, self.keep_last, prunes=trainer.is_global_zero)

    def record(self, iteration: RecordedIteration) -> None:
        """Queue an iteration for the background writer (`RLModule` calls it once per iteration, on every rank)."""
        self._writer.submit(iteration)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._writer is not None:
            self._writer.flush()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # what is queued is written: the iteration that failed is the one a replay wants; a failed write is said, not
        # raised (the run's own exception is the one to see)
        try:
            self._close()
        except RuntimeError as error:
            warnings.warn(str(error))

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._close()

    def _close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
