"""Micro-batches by token budget (``loop.max_tokens_per_micro_batch``).

Consecutive samples are grouped so that the real prompt + response tokens of a micro-batch stay within
the budget (a sample longer than the budget is a micro-batch of its own); each micro-batch is cut to
its own widest prompt and response, and the trainer runs it packed (lightning_rl.core.packing), so its cost
follows the tokens it holds, not rows x the longest response of the batch. Samples stay in order, so a
group's samples stay together and share their prompt in the packed row.

The loss stays exact: the aggregators divide by the normaliser of the whole mini-batch
(``Aggregator.denominator``), whatever the micro-batches.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_rl.core.batch import PER_TOKEN, PROMPT, RolloutBatch


def token_budget_groups(lengths: list[int], budget: int) -> list[tuple[int, int]]:
    """``[start, stop)`` runs of consecutive samples whose ``lengths`` add up to at most ``budget`` each."""
    if budget < 1:
        raise ValueError(f"loop.max_tokens_per_micro_batch must be >= 1, got {budget}")
    runs, start, used = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and used + n > budget:
            runs.append((start, i))
            start, used = i, 0
        used += n
    if lengths:
        runs.append((start, len(lengths)))
    return runs


def trim(batch: RolloutBatch) -> RolloutBatch:
    """The batch cut to its widest real response (right padding) and prompt (left padding)."""
    r = max(1, int(batch.response_mask.sum(-1).max()))
    fields = {k: v[:, :r] for k, v in batch.tensors().items() if k in PER_TOKEN}
    if batch.prompt_mask is not None:
        p = max(1, int(batch.prompt_mask.sum(-1).max()))
        fields.update({k: v[:, -p:] for k, v in batch.tensors().items() if k in PROMPT})
    return batch.replace(**fields)


def micro_batches(batch: RolloutBatch, size: int, max_tokens: int | None) -> list[RolloutBatch]:
    """Fixed-size chunks of ``size`` samples, or, with ``max_tokens``, trimmed token-budget micro-batches."""
    if max_tokens is None:
        return batch.split(size)
    lengths = batch.response_mask.sum(-1)
    if batch.prompt_mask is not None:
        lengths = lengths + batch.prompt_mask.sum(-1)
    return [trim(batch.select(slice(a, b))) for a, b in token_budget_groups(lengths.tolist(), max_tokens)]


def pad_to(values: Tensor, width: int) -> Tensor:
    """Right-pad a per-token field of a trimmed micro-batch back to the batch's width. Shape: (b, r, ...) -> (b, width, ...)."""
    return torch.nn.functional.pad(values, (0, 0) * (values.dim() - 2) + (0, width - values.shape[1]))
