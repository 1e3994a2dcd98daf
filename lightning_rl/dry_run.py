"""`lightning-rl fit --config X --dry_run`: what a run would do, without training it."""

from __future__ import annotations

from lightning.pytorch.callbacks import ModelCheckpoint


def describe(cli) -> str:
    """The composed components, the derived batch arithmetic, the models and the run's folders."""
    model, data, trainer = cli.model, cli.datamodule, cli.trainer
    loop, rollout = model.loop, model.rollout
    lines = ["components:"]
    for key in ("rollout", "reward", "advantage", "surrogate", "aggregator", "kl", "critic", "sampling", "ptx"):
        part = getattr(model, key, None)
        if part is not None:
            lines.append(f"  model.{key:11s} {type(part).__name__}")
    for term in model.loss_terms:
        lines.append(f"  model.loss_terms  {type(term).__name__}")
    world = trainer.world_size
    prompts = data.hparams.batch_size
    samples = prompts * rollout.group_size
    steps = loop.ppo_epochs * loop.num_mini_batches
    per_step = samples // loop.num_mini_batches
    lines += [
        "per iteration:",
        f"  prompts            {prompts} per rank x {world} rank(s) = {prompts * world}",
        f"  samples            {samples} per rank (group_size {rollout.group_size}) = {samples * world}",
        f"  optimizer steps    {steps} (ppo_epochs {loop.ppo_epochs} x num_mini_batches {loop.num_mini_batches})",
        f"  per optimizer step {per_step * world} samples, at most {per_step * world * rollout.max_new_tokens} response tokens",
        f"  iterations         {trainer.max_steps} (trainer.max_steps)",
    ]
    model.configure_model()
    lines.append("models:")
    for name, module in (("policy", model.policy), ("reference", model.reference), ("critic", model.critic), ("reward", model.reward)):
        params = list(module.parameters()) if hasattr(module, "parameters") else []
        if params:
            trainable = sum(p.numel() for p in params if p.requires_grad)
            lines.append(f"  {name:10s} {sum(p.numel() for p in params):,} parameters ({trainable:,} trainable)")
    if model.reference is None and getattr(model, "reference_is_base", False):
        lines.append("  reference  the policy with its LoRA adapters off (no second model)")
    logger = trainer.logger
    lines.append("folders:")
    if logger is not None and getattr(logger, "save_dir", None):
        lines.append(f"  logs         {logger.save_dir}/{logger.name}/version_<next> (runs/<name>/latest links to the newest)")
    for checkpoint in (c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)):
        lines.append(f"  checkpoints  {checkpoint.dirpath} (moved into the run's version folder when under the log folder)")
    return "\n".join(lines)
