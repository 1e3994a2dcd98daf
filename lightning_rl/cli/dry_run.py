"""`lightning-rl fit --config X --dry_run`: what a run would do, without training it."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from lightning_rl.callbacks.record import FOLDER, RecordRollouts
from lightning_rl.roster import ROSTER
from lightning_rl.runs import LATEST, continued_run, follows_run, resolve_checkpoint, shown_path, versioned


def describe(cli) -> str:
    """The composed components, the derived batch arithmetic, the models and the run's folders."""
    model, data, trainer = cli.model, cli.datamodule, cli.trainer
    loop, rollout = model.loop, model.rollout
    lines = ["components:"]
    for key in (
        "rollout",
        "reward",
        "advantage",
        "surrogate",
        "aggregator",
        "kl",
        "critic",
        "teacher",
        "sampling",
        "ptx",
    ):
        part = getattr(model, key, None)
        if part is not None:
            lines.append(f"  model.{key:11s} {type(part).__name__}")
    for term in model.loss_terms:
        lines.append(f"  model.loss_terms  {type(term).__name__}")
    world = trainer.world_size
    prompts = data.hparams.batch_size
    samples = prompts * rollout.params.group_size
    steps = loop.ppo_epochs * loop.num_mini_batches
    per_step = samples // loop.num_mini_batches
    lines += [
        "per iteration:",
        f"  prompts            {prompts} per rank x {world} rank(s) = {prompts * world}",
        f"  samples            {samples} per rank (group_size {rollout.params.group_size}) = {samples * world}",
        f"  optimizer steps    {steps} (ppo_epochs {loop.ppo_epochs} x num_mini_batches {loop.num_mini_batches})",
        f"  per optimizer step {per_step * world} samples, at most {per_step * world * rollout.params.max_new_tokens} response tokens",
        f"  iterations         {trainer.max_steps} (trainer.max_steps)",
        "  sampling           "
        + (
            f"asynchronous: {loop.max_staleness} round(s) ahead, on weights at most {loop.max_staleness} version(s) older "
            "(loop.max_staleness); old log-probs "
            + ("recomputed" if model.recompute_old else "from the update's own forward (one optimizer step per batch)")
            if loop.max_staleness
            else "synchronous (loop.max_staleness 0)"
        ),
    ]
    model.configure_model()
    lines.append("models:")
    shown: set[int] = set()
    for slot in ROSTER:  # each model the run holds (lightning_rl.roster), once: a reward that also validates is one
        part = slot.model(model)
        params = list(part.parameters()) if isinstance(part, nn.Module) and id(part) not in shown else []
        shown.add(id(part))
        if params:
            trainable = sum(p.numel() for p in params if p.requires_grad)
            lines.append(f"  {slot.name:10s} {sum(p.numel() for p in params):,} parameters ({trainable:,} trainable)")
        note = slot.note(model)
        if note is not None:
            lines.append(f"  {slot.name:10s} {note}")
    lines.append("folders:")
    lines += _folders(trainer, cli.config_init["fit"].get("ckpt_path"), bool(cli.config_init["fit"].get("new_run")))
    return "\n".join(lines)


def _folders(trainer, ckpt_path: str | None, new_run: bool) -> list[str]:
    """Where the run will write (lightning_rl.runs decides it the same way when fit starts)."""
    logger, lines = trainer.logger, []
    run = None
    if logger is not None and versioned(logger):
        run = continued_run(logger, resolve_checkpoint(ckpt_path), "fit", new_run)
        if run is not None:
            lines.append(
                f"  logs         {shown_path(run)} (continued from its checkpoint; --new_run starts a new version)"
            )
        else:
            run = Path(logger.save_dir) / logger.name / "version_<next>"
            lines.append(
                f"  logs         {shown_path(run)} ({shown_path(run.parent / LATEST / 'checkpoints')} will link to its checkpoints)"
            )
    for checkpoint in (c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)):
        moved = run is not None and follows_run(checkpoint.dirpath, logger)
        if moved or checkpoint.dirpath is not None:
            lines.append(f"  checkpoints  {shown_path(run / 'checkpoints' if moved else Path(checkpoint.dirpath))}")
    for recorder in (c for c in trainer.callbacks if isinstance(c, RecordRollouts)):  # record_rollouts
        kept = "every iteration" if recorder.keep_last is None else f"the last {recorder.keep_last} iterations"
        where = shown_path(run / FOLDER) if run is not None else f"{trainer.default_root_dir}/{FOLDER}"
        lines.append(f"  rollouts     {where} ({kept}; lightning-rl replay --rollouts trains from it)")
    return lines
