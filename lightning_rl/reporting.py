"""Iteration logging for `RLModule`: metrics reduced over ranks in one host sync, straight to the loggers,
and a table of sampled completions (lightning_rl.samples) on the console and as TensorBoard text."""

from __future__ import annotations

import torch

from .batch import RolloutBatch
from .metrics import PhaseTimer, WeightedMeans
from .ops import all_reduce_sum, masked_mean, zero_variance_fraction
from .prompts import visible_text
from .samples import markdown, print_rows, sample_rows


# TensorBoard's Custom Scalars tab, in this order: what a researcher reads first (the Scalars tab sorts groups by name)
LAYOUT = {
    "1 training signal": {
        "reward (mean, parts, raw, shaped)": ["Multiline", [r"^reward/(mean|raw_mean|shaped_mean)$", r"^reward/(?!std|mean|raw_mean|shaped_mean|timeout|error)"]],
        "validation (greedy reward, pass@k, mean@k)": ["Multiline", [r"^val/.*(reward|pass@|mean@)"]],
        "response length (tokens)": ["Multiline", [r"^response_length/mean$", r"^val/.*response_length$"]],
    },
    "2 policy": {
        "loss": ["Multiline", [r"^policy/loss$"]],
        "KL (nats)": ["Multiline", [r"^kl/ref$", r"^policy/approx_kl$"]],
        "entropy (nats)": ["Multiline", [r"^policy/entropy$"]],
        "clip fraction": ["Multiline", [r"^policy/clipfrac"]],
        "gradient norm": ["Multiline", [r"^policy/grad_norm$"]],
    },
    "3 cost": {
        "seconds per phase": ["Multiline", [r"^time/"]],
        "tokens per second": ["Multiline", [r"^throughput/"]],
    },
}


class IterationReporting:
    """Logging of one RL iteration, for `RLModule`."""

    def _log_iteration(self, batch: RolloutBatch, meta: dict, metrics: WeightedMeans, timer: PhaseTimer) -> None:
        sampled = batch.sample_mask if batch.is_greedy is None else (batch.is_greedy == 0).float()
        lengths = batch.action_tokens.sum(-1)  # the model's tokens: a multi-turn transcript's observations are not its length
        metrics.add("reward/mean", masked_mean(batch.scores, sampled), sampled.sum())
        for key in [k for k in meta if k.startswith("reward/")]:  # a Composite reward's parts, unweighted
            metrics.add(key, masked_mean(torch.tensor(meta[key], device=sampled.device), sampled), sampled.sum())
        metrics.add("reward/std", masked_mean((batch.scores - masked_mean(batch.scores, sampled)).square(), sampled).sqrt())
        metrics.add("response_length/mean", masked_mean(lengths, sampled), sampled.sum())
        metrics.add("response_length/truncated_frac", masked_mean(batch.truncated.float(), sampled), sampled.sum())
        if self.sampling is None and batch.batch_size and self.rollout.group_size > 1:  # groups of one have no variance to lack; with dynamic sampling, _collect logs it before filtering
            metrics.add("sampling/zero_var_groups", zero_variance_fraction(batch.scores, batch.group_ids, batch.is_greedy))
        if batch.env_rewards is not None or (self.kl is not None and self.kl.placement == "reward"):
            # the return the advantage sees (score + KL penalty + environment rewards), beside the score: TRL's rlhf_reward
            metrics.add("reward/shaped_mean", masked_mean(batch.token_rewards.sum(-1), sampled), sampled.sum())
        if self.kl is not None:
            metrics.add("kl/coef", self.kl.coef.float())
        values = metrics.compute()
        values["policy/old_logprobs_recomputed"] = torch.tensor(float(self.recompute_old))
        seconds = timer.metrics()
        total = sum(seconds.values())
        responses = torch.tensor(float(batch.batch_size), device=batch.response_mask.device)
        done = torch.stack([batch.response_mask.sum().float(), responses])  # tokens, responses
        tokens, samples = all_reduce_sum(done) / max(total, 1e-9)
        values["throughput/tokens_per_s"], values["throughput/samples_per_s"] = tokens, samples
        values["optim/lr_policy"] = torch.tensor(self.optimizers().param_groups[0]["lr"])
        scalars = dict(zip(values, torch.stack([v.float().reshape(()) for v in values.values()]).tolist()))
        self._write_metrics({**scalars, **seconds})
        self.health.observe(scalars, self.global_step)  # divergence, said once (lightning_rl.health)
        if self.trainer.progress_bar_callback is not None:  # self.log costs ~1 ms: only when a bar shows it
            self.log("reward", values["reward/mean"], prog_bar=True, on_step=True, logger=False, batch_size=batch.batch_size)
        every = self.loop.log_samples_every_n_steps
        if every and (self.global_step - 1) % every == 0:  # the first iteration, then every N: a short run shows samples too
            self._log_samples(meta, batch)

    def _write_metrics(self, scalars: dict[str, float]) -> None:
        """Iteration metrics (already reduced over ranks, one host sync for all) straight to the loggers and to
        ``trainer.callback_metrics`` / ``logged_metrics``. ``self.log`` costs ~1 ms of host time per metric
        (Lightning's result collection moves and deep-copies each entry), ~20 ms per iteration for these ~25."""
        trainer = self.trainer
        tensors = {k: torch.tensor(v) for k, v in scalars.items()}
        trainer.callback_metrics.update(tensors)
        trainer.logged_metrics.update(tensors)
        experiment = getattr(self.logger, "experiment", None) if self.global_rank == 0 else None
        if hasattr(experiment, "add_custom_scalars") and not getattr(self, "_layout_written", False):
            experiment.add_custom_scalars(LAYOUT)  # once per run (a resumed run writes it into its own events)
            self._layout_written = True
        if trainer.loggers and trainer.log_every_n_steps and self.global_step % trainer.log_every_n_steps == 0:  # Lightning's cadence
            for logger in trainer.loggers:  # the step Lightning's own logging would use: iterations before this one
                logger.log_metrics(scalars, step=self.global_step - 1)

    def _log_samples(self, meta: dict, batch: RolloutBatch) -> None:
        if self.global_rank != 0:
            return
        rows = sample_rows(meta, batch, self.loop.log_samples, lambda ids: visible_text(self.tokenizer, ids))
        experiment = getattr(self.logger, "experiment", None)
        if hasattr(experiment, "add_text"):
            experiment.add_text("samples", markdown(rows), self.global_step)
        bar = self.trainer.progress_bar_callback
        print_rows(rows, f"samples at iteration {self.global_step}", getattr(getattr(bar, "progress", None), "console", None))
