"""Phase 2 of an RL iteration, score (the trainer's side; the reward scored the batch during collect): the trainer's
no-grad forward passes, one per slot of the roster that asks for one (lightning_rl.roster): ``old_logprobs`` (pi_old,
the policy), ``ref_logprobs`` (the reference), ``values`` (the critic), ``teacher_logprobs`` (the teacher)."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.config import LoopConfig
from lightning_rl.core.microbatch import micro_batches, pad_to
from lightning_rl.roster import Scorer


class TrainerForward:
    """The roster's trainer forward passes, batched under no_grad, at the sampling temperature.

    The policy's pass (old log-probs) is left out unless they are recomputed: when the update is on-policy and
    nothing reads them before the optimize phase, the ratio is 1 there by construction (the optimize phase takes pi_old
    from its own pass)."""

    def __init__(self, scorers: list[Scorer], loop: LoopConfig):
        """``scorers``: the passes, in roster order (`lightning_rl.roster.scorers`)."""
        self.scorers, self.loop = scorers, loop

    @torch.no_grad()
    def __call__(self, batch: RolloutBatch, temperature: float) -> RolloutBatch:
        fields: dict[str, list[Tensor]] = {}
        loop = self.loop
        packed, width = loop.max_tokens_per_micro_batch is not None, batch.response_ids.shape[1]
        for chunk in micro_batches(batch, loop.forward_batch_size, loop.max_tokens_per_micro_batch):
            for scorer in self.scorers:
                for name, value in scorer(chunk, temperature, packed).items():
                    fields.setdefault(name, []).append(value)
        mask = batch.response_mask
        return batch.replace(**{k: _masked(torch.cat([pad_to(x, width) for x in v]), mask) for k, v in fields.items()})


def _masked(values: Tensor, mask: Tensor) -> Tensor:
    """Zero after each response's end. Shapes: (B, R, ...), (B, R) -> (B, R, ...)."""
    return values * mask.reshape(*mask.shape, *[1] * (values.dim() - 2)).to(values.dtype)
