"""Typed settings of the loop and the optimiser (LightningCLI shows these docstrings in ``--help``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


@dataclass
class OptimizerConfig:
    """AdamW and its LR schedule for one parameter group (the policy's, or the critic's)."""

    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0
    """Optimizer steps of linear warmup (after any critic pretraining, for the policy)."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    total_steps: int | None = None
    """Optimizer steps over which linear / cosine decay to ``min_lr_ratio``; required by those schedules."""
    min_lr_ratio: float = 0.0
    max_grad_norm: float | None = 1.0
    """Clip this group's gradients to this global norm (None = no clipping)."""

    def __post_init__(self) -> None:
        # jsonargparse builds this from YAML for model.optimizer and for a critic's optimizer
        if not (math.isfinite(self.lr) and self.lr >= 0):
            raise ValueError(
                f"optimizer lr={self.lr} (model.optimizer.lr, or the critic's optimizer.lr) must be a finite number >= 0, e.g. 1e-5"
            )
        if self.weight_decay < 0 or self.warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(
                f"optimizer: weight_decay ({self.weight_decay}) and warmup_steps ({self.warmup_steps}) must be >= 0 "
                f"and min_lr_ratio ({self.min_lr_ratio}) in [0, 1]"
            )
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"optimizer max_grad_norm={self.max_grad_norm} must be > 0 (or null for no clipping)")

    def lr_factor(self, step: int) -> float:
        """Multiplier on ``lr`` after ``step`` optimizer steps."""
        if self.warmup_steps and step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        if self.total_steps is None:
            raise ValueError(f"schedule={self.schedule!r} needs total_steps (optimizer steps over which to decay)")
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        decay = 1.0 - progress if self.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * decay


@dataclass
class LoopConfig:
    """How one RL iteration spends its batch: epochs x mini-batches x micro-batches."""

    ppo_epochs: int = 1
    """Passes over each rollout batch. With 1 epoch and 1 mini-batch the update is on-policy (ratio == 1)."""
    num_mini_batches: int = 1
    """Optimizer steps per epoch; the batch is shuffled and cut into this many mini-batches."""
    micro_batch_size: int = 64
    """Samples per forward/backward; gradients accumulate over a mini-batch (the loss is exact either way)."""
    forward_batch_size: int = 128
    """Samples per no-grad forward pass (old / reference log-probs, values)."""
    max_tokens_per_micro_batch: int | None = None
    """Token budget per micro-batch (prompt + response tokens) for every trainer forward and the update, run
    padding-free (packed); replaces micro_batch_size and forward_batch_size. None = fixed-size micro-batches."""
    mask_truncated: bool = False
    """Leave responses that hit max_new_tokens without EOS out of the loss (DAPO overlong filtering)."""
    target_kl: float | None = None
    """Stop this iteration's remaining PPO epochs once an epoch's mean approx-KL(pi_old || pi_theta) (k3, over
    its tokens and ranks) exceeds this (Schulman et al.'s early stopping, as in CleanRL / SB3); None = never."""
    max_staleness: int = 0
    """Asynchronous training: sample the next iterations' prompts (this many rounds ahead) while this one optimizes, on
    weights at most this many versions older than those they train; older groups are dropped and counted. Pair it with
    a surrogate that corrects for the staleness (DecoupledClip). 0 = synchronous: sample, then train."""
    skip_degenerate_batches: bool = True
    """Skip the optimize phase (with a warning) when every advantage is zero: nothing to learn, only noise."""
    log_samples_every_n_steps: int = 20
    """Print and write to TensorBoard (text) a table of completions at the first iteration and every N after (0 = never)."""
    log_samples: int = 4
    """Rows in that table, one per prompt (its first sampled completion), with reward, gold answer and advantage."""
    val_samples: int = 0
    """Responses sampled per held-out prompt at validation, beside the greedy one: logs ``val/pass@k`` (k = 1, 2, 4,
    ..., n; a score >= 1 counts as solved) and ``val/mean@n`` (0 = greedy accuracy only)."""
    val_temperature: float = 1.0
    """Sampling temperature of those responses."""
    logprob_chunk_rows: int | None = None
    """Rows per chunk of the fp32 log-softmax (None = ~16 MB chunks)."""
    max_nonfinite_steps: int = 3
    """Optimizer steps in a row skipped for a NaN/inf loss or gradient norm before the run stops (0 = never stop)."""
    degenerate_patience: int = 10
    """Warn (once) when every group is degenerate for this many iterations in a row (0 = never)."""
    min_entropy: float = 1e-3
    """Warn (once) when the policy's mean token entropy falls below this (0 = never)."""

    def __post_init__(self) -> None:
        sizes = {
            "ppo_epochs": self.ppo_epochs,
            "num_mini_batches": self.num_mini_batches,
            "micro_batch_size": self.micro_batch_size,
            "forward_batch_size": self.forward_batch_size,
        }
        for key, value in sizes.items():
            if value < 1:
                raise ValueError(f"model.loop.{key}={value} must be >= 1")
        if self.max_staleness < 0:
            raise ValueError(f"model.loop.max_staleness={self.max_staleness} must be >= 0 (0 = synchronous)")
        if self.max_tokens_per_micro_batch is not None and self.max_tokens_per_micro_batch < 1:
            raise ValueError(
                f"model.loop.max_tokens_per_micro_batch={self.max_tokens_per_micro_batch} must be >= 1 (prompt + response tokens per micro-batch), or null for fixed-size micro-batches"
            )
        if self.logprob_chunk_rows is not None and self.logprob_chunk_rows < 1:
            raise ValueError(f"model.loop.logprob_chunk_rows={self.logprob_chunk_rows} must be >= 1 (or null)")
        if self.val_samples < 0 or self.val_temperature <= 0:
            raise ValueError(
                f"model.loop: val_samples ({self.val_samples}) must be >= 0 and val_temperature ({self.val_temperature}) > 0"
            )
        if (
            self.log_samples_every_n_steps < 0
            or self.log_samples < 0
            or self.max_nonfinite_steps < 0
            or self.degenerate_patience < 0
        ):
            raise ValueError(
                "model.loop: log_samples_every_n_steps, log_samples, max_nonfinite_steps and degenerate_patience must be >= 0"
            )
