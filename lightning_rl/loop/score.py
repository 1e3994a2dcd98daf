"""Phase 2 of an RL iteration, score (the trainer's side; the reward scored the batch during collect): the trainer's
no-grad forward passes give ``old_logprobs`` (pi_old), ``ref_logprobs`` (the reference) and ``values`` (the critic)."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import Tensor, nn

from components.critic import ValueCritic
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.config import LoopConfig
from lightning_rl.core.logprobs import policy_logprobs
from lightning_rl.core.lora import adapters_disabled
from lightning_rl.core.microbatch import micro_batches, pad_to


class TrainerForward:
    """Old / reference log-probs and values, batched under no_grad, at the sampling temperature.

    Old log-probs are skipped unless ``recompute_old``: when the update is on-policy and nothing reads them before
    the optimize phase, the ratio is 1 there by construction (the optimize phase takes pi_old from its own pass)."""

    def __init__(
        self,
        policy: nn.Module,
        reference: nn.Module | None,
        reference_is_base: bool,
        critic: ValueCritic | None,
        loop: LoopConfig,
        recompute_old: bool,
    ):
        """``reference_is_base``: a LoRA policy without a reference model scores reference log-probs with its adapters off."""
        self.policy, self.reference, self.reference_is_base, self.critic = policy, reference, reference_is_base, critic
        self.loop, self.recompute_old = loop, recompute_old

    def reference_model(self):
        """Context giving the model that scores ``ref_logprobs``: the loaded reference, or the LoRA policy with adapters off."""
        if self.reference is not None:
            return nullcontext(self.reference)
        return adapters_disabled(self.policy)

    @torch.no_grad()
    def __call__(self, batch: RolloutBatch, temperature: float) -> RolloutBatch:
        fields: dict[str, list[Tensor]] = {}
        loop = self.loop
        packed, width = loop.max_tokens_per_micro_batch is not None, batch.response_ids.shape[1]
        for chunk in micro_batches(batch, loop.forward_batch_size, loop.max_tokens_per_micro_batch):
            if self.recompute_old:
                fields.setdefault("old_logprobs", []).append(
                    policy_logprobs(self.policy, chunk, temperature, chunk_rows=loop.logprob_chunk_rows, packed=packed)[
                        0
                    ]
                )
            if self.reference is not None or self.reference_is_base:
                with self.reference_model() as reference:
                    fields.setdefault("ref_logprobs", []).append(
                        policy_logprobs(
                            reference, chunk, temperature, chunk_rows=loop.logprob_chunk_rows, packed=packed
                        )[0]
                    )
            if self.critic is not None:
                fields.setdefault("values", []).append(self.critic(chunk, packed=packed).float())
        mask = batch.response_mask.float()
        return batch.replace(**{k: torch.cat([pad_to(x, width) for x in v]) * mask for k, v in fields.items()})
