"""The set-up every run gets, written once: `lightning-rl` (lightning_rl.cli) and `lightning_rl.Trainer` both use it.

- the Trainer defaults (default_trainer.yaml): a run folder ``runs/<name>/version_N`` with TensorBoard events and
  ``checkpoints/``; validation every 50 iterations; no model summary;
- the RL progress bar (lightning_rl.callbacks.progress) unless the bar is off or the run brings its own;
- atomic checkpoint files (lightning_rl.checkpoint) unless the run brings its own CheckpointIO;
- the run folder chosen before anything is written (lightning_rl.runs): ``latest`` in a checkpoint path resolved first,
  a run's own checkpoint continues that run (with the policy it was trained from), else a new version is claimed;
- the prompts tokenised with the policy's tokenizer (``model.policy.path`` -> ``data.tokenizer``);
- a run a SIGTERM stopped ends with exit status 143 once it has saved (`ending_on_sigterm`), never 0.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml
from lightning.pytorch.cli import instantiate_class

from lightning_rl.callbacks.progress import missing_progress_bar
from lightning_rl.checkpoint import with_atomic_checkpoints
from lightning_rl.core.models import PolicyHolder
from lightning_rl.data.prompts import PromptDataModule
from lightning_rl.runs import check_continued_policy, resolve_checkpoint, start_run

DEFAULT_TRAINER_CONFIG = str(Path(__file__).with_name("default_trainer.yaml"))
TOKENIZER_LINK = ("model.policy.path", "data.tokenizer")
"""The prompts are tokenised with the policy's tokenizer: the CLI links these two config keys."""


SIGTERM_EXIT = 128 + signal.SIGTERM
"""The exit status of a run a SIGTERM stopped, as a shell reports a process the signal ended: a scheduler that
pre-empted the run never reads it as a success."""

T = TypeVar("T")


def ending_on_sigterm(trainer, run: Callable[[], T]) -> T:
    """``run()`` (the Trainer's fit or validate), ending with `SIGTERM_EXIT` when a SIGTERM arrived meanwhile: Lightning
    ends the iteration, the fault callbacks write last.ckpt, then it raises a ``SystemExit`` without a status (0)."""
    try:
        result = run()
    except BaseException as err:
        if not trainer.received_sigterm:
            raise
        _say_stopped(trainer, f" ({type(err).__name__} on the way out)" if not isinstance(err, SystemExit) else "")
        raise SystemExit(SIGTERM_EXIT) from err
    if trainer.received_sigterm:  # it arrived in the last iteration: the run is saved, and was still stopped
        _say_stopped(trainer, "")
        raise SystemExit(SIGTERM_EXIT)
    return result


def _say_stopped(trainer, detail: str) -> None:
    if trainer.is_global_zero:
        print(f"stopped by SIGTERM{detail}: exit status {SIGTERM_EXIT}", file=sys.stderr, flush=True)


def trainer_defaults(name: str = "default", save_dir: str = "runs") -> dict[str, Any]:
    """The Trainer arguments of default_trainer.yaml (what `lightning-rl fit` starts from) with the run named ``name``
    under ``save_dir``, its logger and callbacks built."""
    config = yaml.safe_load(Path(DEFAULT_TRAINER_CONFIG).read_text())
    trainer = dict(config["trainer"])
    trainer["default_root_dir"] = f"{save_dir}/{name}"
    logger = trainer["logger"]
    trainer["logger"] = instantiate_class(
        (), {**logger, "init_args": {**logger["init_args"], "save_dir": save_dir, "name": name}}
    )
    callbacks = []
    for callback in trainer.get("callbacks") or []:
        if callback["class_path"].endswith(".ModelCheckpoint"):  # the run's checkpoints: moved into its version folder
            callback = {**callback, "init_args": {**callback["init_args"], "dirpath": f"{save_dir}/{name}/checkpoints"}}
        callbacks.append(instantiate_class((), callback))
    trainer["callbacks"] = callbacks
    return trainer


def as_list(callbacks) -> list:
    """A Trainer's ``callbacks`` argument (a list, one callback or None) as a list."""
    return list(callbacks) if isinstance(callbacks, list) else [] if callbacks is None else [callbacks]


def progress_bar(callbacks: list, enable_progress_bar, unit: str = "RL iterations") -> list:
    """The RL progress bar counting ``unit`` to add to ``callbacks``: none when the bar is off (``enable_progress_bar``
    False) or ``callbacks`` hold a progress bar."""
    return missing_progress_bar(callbacks, enable_progress_bar is not False, unit)


def with_run_plugins(plugins) -> list:
    """The Trainer's ``plugins`` with atomic checkpoint files, unless they bring their own CheckpointIO."""
    return with_atomic_checkpoints(plugins)


def begin_run(trainer, stage: str, ckpt_path, new_run: bool = False, policy_path: str | None = None) -> str | None:
    """Before Lightning runs ``stage`` (``fit`` / ``validate``): the checkpoint path with ``latest`` resolved (before a
    new run moves ``latest``), a continued run checked to train the policy it was trained from, the run's folder chosen.
    Returns the resolved checkpoint path."""
    ckpt_path = resolve_checkpoint(None if ckpt_path is None else str(ckpt_path))
    if stage == "fit" and not new_run and policy_path is not None:
        check_continued_policy(ckpt_path, policy_path)  # before anything is written or loaded
    start_run(trainer, stage, ckpt_path, new_run=new_run)
    return ckpt_path


def link_tokenizer(model, data) -> None:
    """`TOKENIZER_LINK` for a model and data module built in Python: a data module whose tokenizer is not set takes the
    policy's path."""
    if isinstance(data, PromptDataModule) and data.hparams.tokenizer is None and isinstance(model, PolicyHolder):
        data.hparams.tokenizer = model.policy_spec.path
