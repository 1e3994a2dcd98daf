"""What a failure leaves behind: `ResumableCheckpoints` (below), `FiniteCheckpoints` (no checkpoint of NaN/inf weights:
the previous one stays), `TeardownOnException`.

`ResumableCheckpoints`: ``last.ckpt`` always holds the last completed RL iteration when ``fit`` stops.

Lightning's ModelCheckpoint writes ``last.ckpt`` only when its cadence fires: a run of 60 iterations
saving every 50 ends with ``last.ckpt`` at iteration 50, and a Ctrl-C, a SIGTERM from the scheduler or
an exception in a component loses everything since the last cadence save. This callback closes both
gaps, writing through the configured ModelCheckpoint (its ``dirpath``, its ``last`` file name):

- at the end of ``fit``, when the final iteration is not saved yet;
- when ``fit`` is interrupted: the weights and optimizer state are those of the last completed
  iteration as long as no optimizer step of the interrupted one ran, and the random streams and the
  prompt stream's position are set back to where that iteration started, so the resumed run redoes
  the interrupted iteration exactly; once the interrupted iteration's update is done (``LoopState.trained``: the
  failure came after it, in the weight push or the report), that iteration is saved as it is. SIGTERM is turned into an exception by Lightning at an iteration
  boundary on every rank at once; other interrupts are saved in single-process runs only (a collective
  save started by one rank of several would hang).

RLModule adds it (``configure_callbacks``); nothing to configure.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from lightning import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_rl.checkpoint import Resumable, non_finite_entries
from lightning_rl.core.errors import NonFiniteTrainingError
from lightning_rl.core.ops import all_reduce_sum
from lightning_rl.data.prompts import PromptDataModule
from lightning_rl.runs import shown_path


def last_checkpoint_callbacks(trainer) -> list[ModelCheckpoint]:
    return [
        c
        for c in trainer.checkpoint_callbacks
        if isinstance(c, ModelCheckpoint) and c.save_last and c.dirpath is not None
    ]


def save_last(trainer, checkpoint: ModelCheckpoint) -> str:
    """Write ``checkpoint``'s ``last`` file at the trainer's current step (replacing a ``save_last: link`` link)."""
    candidates = checkpoint._monitor_candidates(trainer)
    path = checkpoint.format_checkpoint_name(candidates, checkpoint.CHECKPOINT_NAME_LAST)
    if trainer.is_global_zero and os.path.islink(path):
        os.unlink(path)
    checkpoint.last_model_path = path
    checkpoint._save_checkpoint(trainer, path)
    return path


class ResumableCheckpoints(Callback):
    """Write ``last.ckpt`` at the final iteration of ``fit`` and at the last completed one on an interrupt."""

    def __init__(self) -> None:
        self._start: dict | None = None  # what the running iteration started from (see on_train_batch_start)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        data = trainer.datamodule
        state = pl_module.loop_state if isinstance(pl_module, Resumable) else None  # any LightningModule
        self._start = {
            "step": trainer.global_step,
            "loop": state.snapshot()
            if state is not None
            else None,  # random streams (replaced, not mutated, per iteration), optimizer steps
            "position": data.state_dict()
            if isinstance(data, PromptDataModule)
            else None,  # every stream's (prompts, PPO-ptx text)
        }

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self._start = None

    def on_train_end(self, trainer, pl_module) -> None:
        for checkpoint in last_checkpoint_callbacks(trainer):
            if checkpoint._last_global_step_saved != trainer.global_step:
                save_last(trainer, checkpoint)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        callbacks = last_checkpoint_callbacks(trainer)
        if not callbacks or trainer.state.fn != "fit" or trainer.sanity_checking:
            return
        what = type(exception).__name__
        if trainer.world_size > 1 and not isinstance(exception, SIGTERMException):
            warnings.warn(
                f"{what} on one of {trainer.world_size} ranks: last.ckpt stays at its last cadence save (resume from it)"
            )
            return
        start = self._start
        state = pl_module.loop_state if isinstance(pl_module, Resumable) else None  # any LightningModule
        if state is not None and state.trained:  # its update is done (the failure came after it, e.g. in the push)
            start = None  # saved as it is: nothing to go back to
        elif (
            start is not None
            and start["loop"] is not None
            and start["loop"]["optimizer_steps"] != pl_module.loop_state.optimizer_steps
        ):
            warnings.warn(
                f"{what} during the optimizer steps of iteration {start['step'] + 1}: the weights are half updated, "
                "so last.ckpt stays at its last save (resume from it)"
            )
            return
        if start is not None:  # back to where the interrupted iteration started
            if start["loop"] is not None:
                pl_module.loop_state.restore(start["loop"])
            if start["position"] is not None:
                trainer.datamodule.rewind(start["position"])
        for checkpoint in callbacks:
            if checkpoint._last_global_step_saved != trainer.global_step:
                try:
                    path = save_last(trainer, checkpoint)
                except (
                    Exception
                ) as err:  # e.g. non-finite weights (lightning_rl.loop.health): the original error matters more
                    warnings.warn(f"{what}: last.ckpt not updated ({err})")
                    return
                shown = shown_path(path)
                rank_zero_info(
                    f"{what}: saved the last completed iteration ({trainer.global_step}) to {shown}; resume with --ckpt_path {shown}"
                )


class TeardownOnException(Callback):
    """Lightning skips ``LightningModule.teardown`` when ``fit`` fails: run it there too, so the rollout closes
    (a launched SGLang server stops, its temporary weights folder is removed) before the error reaches the user."""

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        pl_module.teardown("fit")


class FiniteCheckpoints(Callback):
    """Fail a save, before any file is touched, when the weights hold NaN/inf (the previous checkpoint stays)."""

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        bad = non_finite_entries(checkpoint.get("state_dict", {}))
        if float(
            all_reduce_sum(torch.tensor(float(len(bad)), device=pl_module.device))
        ):  # every rank fails together (shards differ)
            raise NonFiniteTrainingError(
                f"refusing to save a checkpoint at step {trainer.global_step}: {len(bad)} weight tensor(s) hold NaN/inf "
                f"({', '.join(bad[:3]) or 'on another rank'}{', ...' if len(bad) > 3 else ''}); the previous checkpoint is kept. Lower "
                "model.optimizer.lr or rescale the reward, and resume from the previous checkpoint."
            )
