"""Every place lightning_rl touches a Lightning internal, each where Lightning has no public way to do it.

Three touches, each checked by tests/lightning_rl/test_lightning_compat.py against the installed Lightning (seen
passing on 2.5.0, 2.5.1, the oldest the pyproject allows, and 2.6.6), so a release that changes one fails there,
naming it:

- `count_iteration`: ``trainer.global_step`` is the manual-optimization loop's count of completed ``optimizer.step()``
  calls, and an RL iteration makes many (ppo_epochs x mini-batches x actor and critic) or none (a skipped
  iteration). Lightning's public surface cannot say "this training step was one step"; rewriting the counter is the
  only way to make ``max_steps``, ``every_n_train_steps`` and the logging step count RL iterations.
- `validation_results`: ``trainer.validate`` returns one dict per validation set of what Lightning logged; the
  scalars logged with ``logger=False`` (written at the step of the weights they measure) are added to those dicts
  while Lightning still holds them in the validation loop.
- `run_validation`: validation before the first iteration and after the last, inside ``fit``, as Lightning's
  training loop runs its periodic validation (``trainer.validate`` cannot be called during ``fit``).
"""

from __future__ import annotations

import lightning


class LightningChanged(RuntimeError):
    """A Lightning internal lightning_rl relies on is not where it was."""


def _missing(what: str, path: str) -> LightningChanged:
    return LightningChanged(
        f"lightning {lightning.__version__} has no {path} ({what}; lightning_rl.lightning_compat): this Lightning "
        "release changed an internal lightning_rl uses; install a Lightning release the pyproject allows"
    )


def _manual_step_progress(trainer):
    """The manual-optimization loop's optimizer-step progress, whose ``total.completed`` is ``global_step``."""
    try:
        progress = trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress
        progress.total.ready, progress.total.completed, progress.current.ready, progress.current.completed  # noqa: B018
    except AttributeError:
        raise _missing(
            "the count behind trainer.global_step under manual optimization",
            "trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress.{total,current}.{ready,completed}",
        ) from None
    return progress


def count_iteration(trainer, optimizer_steps: int) -> None:
    """Make ``trainer.global_step`` advance by exactly one for a training step that made ``optimizer_steps``
    ``optimizer.step()`` calls (zero when the step was skipped). The progress counters are saved in checkpoints, so a
    resumed run counts on from the same number."""
    progress = _manual_step_progress(trainer)
    surplus = optimizer_steps - 1
    for tracker in (progress.total, progress.current):
        tracker.ready -= surplus
        tracker.completed -= surplus


def validation_results(trainer) -> list[dict]:
    """The dicts ``trainer.validate`` will return (one per validation set), while the validation loop still holds
    them: adding to them adds to what ``validate`` returns and prints."""
    loop = trainer.validate_loop
    if not hasattr(loop, "_logged_outputs"):
        raise _missing("what trainer.validate returns, per validation set", "trainer.validate_loop._logged_outputs")
    return list(loop._logged_outputs)


def run_validation(trainer) -> None:
    """Run the validation loop now, inside ``fit`` (before the first iteration or after the last), as the training
    loop runs its periodic validation."""
    try:
        loop = trainer.fit_loop.epoch_loop.val_loop
    except AttributeError:
        raise _missing("the validation loop fit runs", "trainer.fit_loop.epoch_loop.val_loop") from None
    trainer.validating = True
    loop.run()
    trainer.training = True
