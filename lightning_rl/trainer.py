"""`lightning_rl.Trainer`: in Python, the Trainer `lightning-rl fit` builds.

    import lightning_rl
    lightning_rl.Trainer(name="dr_grpo", max_steps=100).fit(module, data)   # or lightning_rl.fit(module, data, ...)

What the command line gives, and a bare ``lightning.Trainer`` does not (both from lightning_rl.run_setup): the defaults of
lightning_rl/default_trainer.yaml (a run folder ``runs/<name>/version_N`` with TensorBoard events without ``hp_metric`` and ``checkpoints/``, claimed
before anything is written; validation every 50 iterations, before the first and after the last; no model summary),
the RL progress bar (lightning_rl.callbacks.progress), atomic checkpoint files, the console without Lightning's tips and
expected warnings (lightning_rl.console), ``ckpt_path`` through ``latest/`` continuing the run it belongs to,
the prompts tokenised with the policy's tokenizer, the seed, (``record_rollouts``) the rollout record, and
``SystemExit(143)`` after a SIGTERM (Lightning's has no status: 0).
"""

from __future__ import annotations

import lightning

from lightning_rl.callbacks.record import RecordRollouts
from lightning_rl.console import quiet
from lightning_rl.core.models import PolicyHolder
from lightning_rl.run_setup import (
    as_list,
    begin_run,
    ending_on_sigterm,
    link_tokenizer,
    progress_bar,
    trainer_defaults,
    with_run_plugins,
)


class Trainer(lightning.Trainer):
    """A ``lightning.Trainer`` as `lightning-rl fit` builds it (see the module's doc); every argument of
    ``lightning.Trainer`` overrides the default it names (``callbacks`` replaces the list, as in a config)."""

    def __init__(
        self,
        name: str = "default",
        save_dir: str = "runs",
        seed: int | None = 0,
        record_rollouts: bool | RecordRollouts = False,
        **trainer_args,
    ):
        """
        Args:
            name: the run's name: its folder is ``<save_dir>/<name>/version_N`` (the CLI takes it from the preset).
            save_dir: the folder of every run (TensorBoard's ``--logdir``).
            seed: ``seed_everything`` (0: the CLI's ``seed_everything`` default); None leaves the random state as it is.
            record_rollouts: record every trained batch into the run's ``rollouts/`` (True, or
                ``RecordRollouts(keep_last=N)``), as ``lightning-rl fit --record_rollouts`` does.
            trainer_args: ``lightning.Trainer`` arguments (``max_steps`` counts RL iterations).
        """
        quiet()
        if seed is not None:
            lightning.seed_everything(seed, verbose=False)
        args = {**trainer_defaults(name, save_dir), **trainer_args}
        callbacks = as_list(args.get("callbacks"))
        if record_rollouts:
            callbacks.append(RecordRollouts() if record_rollouts is True else record_rollouts)
        args["callbacks"] = [*callbacks, *progress_bar(callbacks, args.get("enable_progress_bar", True))]
        args["plugins"] = with_run_plugins(args.get("plugins"))
        super().__init__(**args)

    def fit(
        self,
        model,
        train_dataloaders=None,
        val_dataloaders=None,
        datamodule=None,
        ckpt_path=None,
        new_run: bool = False,
        **kwargs,
    ):
        """``lightning.Trainer.fit``; a ``ckpt_path`` of a run's checkpoint (through ``latest/`` or not) continues that run in its
        folder, unless ``new_run``."""
        ckpt_path = self._begin(
            "fit", model, datamodule if datamodule is not None else train_dataloaders, ckpt_path, new_run
        )
        return ending_on_sigterm(
            self,
            lambda: super(Trainer, self).fit(
                model, train_dataloaders, val_dataloaders, datamodule, ckpt_path, **kwargs
            ),
        )

    def validate(self, model=None, dataloaders=None, ckpt_path=None, verbose: bool = True, datamodule=None, **kwargs):
        """``lightning.Trainer.validate``; the points of a run's checkpoint go into that run, at its iteration."""
        ckpt_path = self._begin("validate", model, datamodule if datamodule is not None else dataloaders, ckpt_path)
        return ending_on_sigterm(
            self, lambda: super(Trainer, self).validate(model, dataloaders, ckpt_path, verbose, datamodule, **kwargs)
        )

    def _begin(self, stage: str, model, data, ckpt_path, new_run: bool = False):
        """The run set-up the CLI does too (lightning_rl.run_setup): the checkpoint path resolved, the run's folder
        chosen, the policy's tokenizer for the prompts."""
        policy_path = model.policy_spec.path if isinstance(model, PolicyHolder) else None
        ckpt_path = begin_run(self, stage, ckpt_path, new_run, policy_path)
        link_tokenizer(model, data)
        return ckpt_path


def fit(model, datamodule, ckpt_path: str | None = None, new_run: bool = False, **trainer_args) -> Trainer:
    """``Trainer(**trainer_args).fit(model, datamodule, ckpt_path)`` in one call; returns the Trainer (its
    ``callback_metrics`` hold the last iteration's metrics and the last validation's)."""
    trainer = Trainer(**trainer_args)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, new_run=new_run)
    return trainer
