"""Phase 5's logging: an iteration's metrics reduced over ranks in one host sync, straight to the loggers; histograms
of the rewards, advantages, response lengths and sampler/trainer log-prob gaps (TensorBoard); and a table of sampled
completions (lightning_rl.loop.sample_table) on the console and as TensorBoard text, with the prompts' images as
TensorBoard images."""

from __future__ import annotations

import resource
import sys
from typing import Callable

import torch
from lightning.pytorch.callbacks import RichProgressBar
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.config import LoopConfig
from lightning_rl.core.ops import all_reduce_sum, masked_mean, zero_variance_fraction
from lightning_rl.data.checks import visible_text
from lightning_rl.loop.health import TrainingHealth
from lightning_rl.loop.metrics import PhaseTimer, WeightedMeans
from lightning_rl.loop.sample_table import markdown, picture, print_rows, sample_indices, sample_rows
from lightning_rl.runs import tensorboard

# TensorBoard's Custom Scalars tab, in this order: what a researcher reads first (the Scalars tab sorts groups by name)
LAYOUT = {
    "1 training signal": {
        "reward (mean, min / max, parts, raw, shaped)": [
            "Multiline",
            [
                r"^reward/(mean|min|max|raw_mean|shaped_mean)$",
                r"^reward/(?!std|mean|min|max|raw_mean|shaped_mean|timeout|error)",
            ],
        ],
        "validation (greedy reward, pass@k, mean@n)": ["Multiline", [r"^val/.*(reward|pass@|mean@)"]],
        "response length (tokens: mean, min / max)": [
            "Multiline",
            [r"^response_length/(mean|min|max)$", r"^val/.*response_length$"],
        ],
    },
    "2 policy": {
        "loss": ["Multiline", [r"^policy/loss$"]],
        "KL (nats)": ["Multiline", [r"^kl/ref$", r"^policy/approx_kl$"]],
        "distillation (reverse KL to the teacher, teacher log-prob; nats)": ["Multiline", [r"^distill/"]],
        "entropy (nats)": ["Multiline", [r"^policy/entropy$"]],
        "clip fraction": ["Multiline", [r"^policy/clipfrac"]],
        "gradient norm": ["Multiline", [r"^policy/grad_norm$"]],
    },
    "3 cost": {
        "seconds per phase and per iteration": ["Multiline", [r"^time/"]],
        "tokens per second": ["Multiline", [r"^throughput/"]],
        "samples and tokens so far": ["Multiline", [r"^total/"]],
        "peak memory (MiB)": ["Multiline", [r"^memory/"]],
    },
}
HISTOGRAMS = ("histogram/reward", "histogram/advantage", "histogram/response_length", "histogram/logprob_diff")
"""TensorBoard's *Histograms* tab: the sampled rows' rewards and lengths, the advantage of every token the update saw,
and each such token's |trainer - sampler| log-prob (a rollout that reports them). Rank 0's rows."""
EXTREMES = ("reward/min", "reward/max", "response_length/min", "response_length/max")
"""Over the sampled rows; not written for an iteration without any (dynamic sampling kept no group)."""


class Reporter:
    """The metrics of one RL iteration and the samples table."""

    def __init__(
        self,
        loop: LoopConfig,
        health: TrainingHealth,
        tokenizer,
        kl_coef: Callable[[], Tensor] | None,
        group_size: int,
        filters_groups: bool,
        shapes_reward: bool,
        recompute_old: bool,
        totals: dict[str, float],
    ):
        """
        Args:
            tokenizer: the policy's, to show each prompt in the samples table as the model read it.
            kl_coef: the KL coefficient now (None = no KL, or one that does nothing: coefficient 0 and no target).
            group_size: the rollout's samples per prompt (groups of one have no variance to lack).
            filters_groups: dynamic sampling logs ``sampling/zero_var_groups`` before it filters.
            shapes_reward: the KL penalty sits in the reward (``reward/shaped_mean``).
            recompute_old: whether pi_old comes from a separate forward pass (``policy/old_logprobs_recomputed``).
            totals: samples and tokens of the run so far (``total/*``), updated in place; checkpointed by the module's
                loop state, so a resumed run counts on.
        """
        self.loop, self.health, self.tokenizer, self.kl_coef, self.group_size = (
            loop,
            health,
            tokenizer,
            kl_coef,
            group_size,
        )
        self.filters_groups, self.shapes_reward, self.recompute_old = filters_groups, shapes_reward, recompute_old
        self.totals = totals
        self._layout_written = False

    def iteration(
        self, trainer, batch: RolloutBatch, metrics: WeightedMeans, timer: PhaseTimer, lr: float, log: Callable
    ) -> None:
        """Reduce and write the iteration's metrics; ``log`` is `LightningModule.log` (the progress bar's reward)."""
        sampled = batch.sample_mask if batch.is_greedy is None else (batch.is_greedy == 0).float()
        lengths = batch.action_tokens.sum(
            -1
        )  # the model's tokens: a multi-turn transcript's observations are not its length
        metrics.add("reward/mean", masked_mean(batch.scores, sampled), sampled.sum())
        for name, part in (batch.score_parts or {}).items():  # a Composite reward's parts, unweighted
            metrics.add(f"reward/{name}", masked_mean(part.to(sampled.device), sampled), sampled.sum())
        metrics.add(
            "reward/std", masked_mean((batch.scores - masked_mean(batch.scores, sampled)).square(), sampled).sqrt()
        )
        metrics.add("response_length/mean", masked_mean(lengths, sampled), sampled.sum())
        metrics.add("response_length/truncated_frac", masked_mean(batch.truncated.float(), sampled), sampled.sum())
        rows = sampled.bool()
        metrics.values("histogram/reward", batch.scores[rows])
        metrics.values("histogram/response_length", lengths[rows])
        if batch.advantages is not None:
            metrics.values("histogram/advantage", batch.advantages[batch.loss_mask.bool()])
        for name, value in (("reward", batch.scores), ("response_length", lengths)):
            # every rank adds them (an empty batch gives -inf / inf) so the reduction over ranks stays collective
            value, rows = value.float(), sampled.bool()
            metrics.maximum(
                f"{name}/max", torch.cat([value.masked_fill(~rows, -torch.inf), value.new_full((1,), -torch.inf)]).max()
            )
            metrics.minimum(
                f"{name}/min", torch.cat([value.masked_fill(~rows, torch.inf), value.new_full((1,), torch.inf)]).min()
            )
        _peak_memory(metrics, batch.response_mask.device)
        if not self.filters_groups and batch.batch_size and self.group_size > 1:
            metrics.add(
                "sampling/zero_var_groups", zero_variance_fraction(batch.scores, batch.group_ids, batch.is_greedy)
            )
        if batch.env_rewards is not None or self.shapes_reward:
            # the return the advantage sees (score + KL penalty + environment rewards), beside the score: TRL's rlhf_reward
            metrics.add("reward/shaped_mean", masked_mean(batch.token_rewards.sum(-1), sampled), sampled.sum())
        if self.kl_coef is not None:
            metrics.add("kl/coef", self.kl_coef().float())
        values = metrics.compute()
        seconds = timer.metrics()
        total = sum(seconds.values())
        responses = torch.tensor(float(batch.batch_size), device=batch.response_mask.device)
        done = all_reduce_sum(
            torch.stack([batch.response_mask.sum().float(), responses])
        )  # tokens, responses of every rank
        values["throughput/tokens_per_s"], values["throughput/samples_per_s"] = done / max(total, 1e-9)
        values["total/tokens"], values["total/samples"] = done + torch.tensor(
            [self.totals.get("tokens", 0.0), self.totals.get("samples", 0.0)], device=done.device
        )
        # one device-to-host copy of every reduced value (all on the module's device: stacking refuses a mix)
        scalars = dict(zip(values, torch.stack([v.float().reshape(()) for v in values.values()]).tolist()))
        scalars = {k: v for k, v in scalars.items() if k not in EXTREMES or abs(v) != float("inf")}
        scalars.update(
            {"policy/old_logprobs_recomputed": float(self.recompute_old), "optim/lr_policy": float(lr)}
        )  # host numbers
        self.totals.update(tokens=scalars["total/tokens"], samples=scalars["total/samples"])
        seconds["time/iteration_s"] = timer.elapsed()
        self._write_metrics(trainer, {**scalars, **seconds})
        self._write_histograms(trainer, metrics)
        self.health.observe(scalars, trainer.global_step)  # divergence, said once (lightning_rl.loop.health)
        if trainer.progress_bar_callback is not None:  # self.log costs ~1 ms: only when a bar shows it
            log("reward", values["reward/mean"], prog_bar=True, on_step=True, logger=False, batch_size=batch.batch_size)
        every = self.loop.log_samples_every_n_steps
        if (
            every and (trainer.global_step - 1) % every == 0
        ):  # the first iteration, then every N: a short run shows samples too
            self._log_samples(trainer, batch)

    def _write_metrics(self, trainer, scalars: dict[str, float]) -> None:
        """Iteration metrics (already reduced over ranks, one host sync for all) straight to the loggers and to
        ``trainer.callback_metrics`` / ``logged_metrics``. ``LightningModule.log`` costs ~1 ms of host time per metric
        (Lightning's result collection moves and deep-copies each entry), ~20 ms per iteration for these ~25."""
        tensors = {k: torch.tensor(v) for k, v in scalars.items()}
        trainer.callback_metrics.update(tensors)
        trainer.logged_metrics.update(tensors)
        experiment = tensorboard(trainer)
        if experiment is not None and not self._layout_written:
            experiment.add_custom_scalars(LAYOUT)  # once per run (a resumed run writes it into its own events)
            self._layout_written = True
        if (
            trainer.loggers and trainer.log_every_n_steps and trainer.global_step % trainer.log_every_n_steps == 0
        ):  # Lightning's cadence
            for logger in trainer.loggers:  # the step Lightning's own logging would use: iterations before this one
                logger.log_metrics(scalars, step=trainer.global_step - 1)

    def _write_histograms(self, trainer, metrics: WeightedMeans) -> None:
        """`HISTOGRAMS` at the scalars' cadence and step, by global rank 0 into a logger that draws them."""
        experiment = tensorboard(trainer)
        every = trainer.log_every_n_steps
        if experiment is None or not every or trainer.global_step % every:
            return
        for tag in HISTOGRAMS:
            values = metrics.distribution(tag)
            if values is not None and values.numel():
                experiment.add_histogram(tag, values.cpu().numpy(), trainer.global_step - 1)

    def _log_samples(self, trainer, batch: RolloutBatch) -> None:
        if trainer.global_rank != 0:
            return
        rows = sample_rows(batch, self.loop.log_samples, lambda ids: visible_text(self.tokenizer, ids))
        experiment = tensorboard(trainer)
        if experiment is not None:
            experiment.add_text("samples", markdown(rows), trainer.global_step)
        if batch.images is not None and experiment is not None:  # what the policy saw, beside what it answered
            import numpy as np

            for k, (i, row) in enumerate(zip(sample_indices(batch, self.loop.log_samples), rows)):
                if batch.images[i]:
                    experiment.add_image(
                        f"samples/{k}",
                        np.asarray(picture(batch.images[i], row)),
                        trainer.global_step,
                        dataformats="HWC",
                    )
        bar = trainer.progress_bar_callback
        print_rows(
            rows,
            f"samples at iteration {trainer.global_step}",
            bar.progress.console if isinstance(bar, RichProgressBar) and bar.progress is not None else None,
        )


def _peak_memory(metrics: WeightedMeans, device: torch.device) -> None:
    """The most memory this process has held so far, the largest over ranks: resident set size (host), and on CUDA
    what tensors took and what the caching allocator reserved (what an out-of-memory error counts)."""
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (
        1024 if sys.platform == "darwin" else 1
    )  # bytes on macOS
    metrics.maximum("memory/peak_rss_mib", torch.tensor(rss_kib / 1024, device=device))
    if device.type == "cuda":
        metrics.maximum(
            "memory/peak_cuda_allocated_mib",
            torch.tensor(torch.cuda.max_memory_allocated(device) / 2**20, device=device),
        )
        metrics.maximum(
            "memory/peak_cuda_reserved_mib", torch.tensor(torch.cuda.max_memory_reserved(device) / 2**20, device=device)
        )
