"""Builders for test batches (import as `from tests.helpers import ...`)."""

from __future__ import annotations

import torch

from lightning_rl.core.batch import RolloutBatch, terminal_rewards


def batch_from_scores(scores, lengths=None, width: int | None = None, group_size: int | None = None, **fields) -> RolloutBatch:
    """A RolloutBatch whose responses have ``lengths`` valid tokens (default 1) and the given scores."""
    scores = torch.as_tensor(scores, dtype=torch.float32)
    b = scores.shape[0]
    lengths = torch.as_tensor(lengths if lengths is not None else [1] * b)
    width = width or int(lengths.max())
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    group_size = group_size or b
    return RolloutBatch(
        response_ids=torch.randint(3, 10, (b, width)) * mask,
        response_mask=mask,
        scores=scores,
        token_rewards=terminal_rewards(scores, mask),
        group_ids=torch.arange(b) // group_size,
        sample_mask=torch.ones(b),
        **fields,
    )


def prompts(ids, mask=None, rows: list[dict] | None = None):
    """A `Prompts` batch from token ids (a (P_n, P) tensor or nested lists), an optional mask (default all ones) and
    each prompt's data row (default none)."""
    from lightning_rl.core.batch import Prompts

    ids = torch.as_tensor(ids)
    mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask)
    rows = rows or [{} for _ in range(ids.shape[0])]
    return Prompts(ids, mask, {k: [r[k] for r in rows] for k in rows[0]})
