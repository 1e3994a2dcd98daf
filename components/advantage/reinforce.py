"""`ReinforceBaseline`: REINFORCE with one scalar baseline for the batch (its mean, or a moving average)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import AdvantageEstimator, Advantages, Whiten
from lightning_rl.core.ops import all_reduce_sum, broadcast_to_tokens, sequence_rewards

from .base import reject_greedy_rows


class ReinforceBaseline(AdvantageEstimator, nn.Module):
    """REINFORCE with a baseline (Williams 1992): A_i = R_i - b, broadcast to every token of sample i.

        baseline="batch":  b = mean of R_i over this batch's counted samples, on all ranks
        baseline="ema":    b = m_{k-1}, an exponential moving average of earlier batches' means:
                           m_k = decay * m_{k-1} + (1 - decay) * mean_k,   m_1 = mean_1

    The moving average uses only earlier batches, so it does not depend on the samples it
    scores (unbiased); the first batch, with no history, uses its own mean. Counted samples are
    those with a token in the loss (masked and greedy rows are left out). R_i is the sequence
    return: the score minus any KL-in-reward. The average is a buffer, so checkpoints carry it;
    each call is one step of it (the module calls the estimator once per iteration).
    """

    def __init__(
        self,
        baseline: Literal["batch", "ema"] = "ema",
        decay: float = 0.9,
        whiten: Whiten = "none",
        shift_mean: bool = True,
        clip: float | None = None,
    ):
        """
        Args:
            baseline: batch (this batch's mean reward) or ema (moving average of earlier batches' means).
            decay: ema only: weight of the old average per batch, in [0, 1) (0 = the previous batch's mean).
            whiten: see `AdvantageEstimator`.
            shift_mean: see `AdvantageEstimator`.
            clip: see `AdvantageEstimator`.
        """
        nn.Module.__init__(self)
        AdvantageEstimator.__init__(self, whiten, shift_mean, clip)
        if baseline not in ("batch", "ema"):
            raise ValueError(f"ReinforceBaseline: baseline must be batch or ema, got {baseline!r}")
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"ReinforceBaseline: decay must be in [0, 1), got {decay}")
        self.baseline, self.decay = baseline, decay
        self.register_buffer("running_mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("batches_seen", torch.zeros((), dtype=torch.long))

    def estimate(self, batch: RolloutBatch) -> Advantages:
        reject_greedy_rows(batch, "ReinforceBaseline")
        rewards = sequence_rewards(batch)  # (B,)
        counted = (batch.loss_mask.sum(-1) > 0).float()  # (B,)
        # fp64 sums: the mean of equal rewards is then exactly that reward, and their advantage exactly 0
        stats = all_reduce_sum(torch.stack([(rewards.double() * counted).sum(), counted.double().sum()]))
        batch_mean = stats[0] / stats[1].clamp_min(1.0)
        if self.baseline == "batch":
            b = batch_mean
        else:
            b = self._ema_step(batch_mean, stats[1] > 0)
        return Advantages(broadcast_to_tokens((rewards.double() - b).float(), batch.action_tokens), None)

    @torch.no_grad()
    def _ema_step(self, batch_mean: torch.Tensor, has_samples: torch.Tensor) -> torch.Tensor:
        """The baseline for this batch (the average before it), then fold this batch's mean in."""
        seen = self.batches_seen > 0
        b = torch.where(seen, self.running_mean, batch_mean)
        updated = torch.where(seen, self.decay * self.running_mean + (1.0 - self.decay) * batch_mean, batch_mean)
        self.running_mean.copy_(torch.where(has_samples, updated, self.running_mean))
        self.batches_seen.add_(has_samples.long())
        return b
