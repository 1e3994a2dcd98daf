"""Padding-free packing: the samples of a micro-batch as one row of concatenated sequences.

Each run of samples sharing a prompt (a group) contributes its prompt's real tokens once, then the
real tokens of each of its responses: no padding column is computed. Every response restarts its
positions after its prompt (``n_prompt + t``, as in its own sequence) and attends, causally, to its
prompt and to itself only (a block-diagonal causal mask, prompts shared within a group). Values and
gradients equal the padded forward's; the cost is the sum of the lengths, not rows x the longest.

Attention backends: SDPA and eager take the block mask as a 4D mask; the others (flash attention,
flex) get no mask and read the sequence boundaries from the restarting position ids, which
transformers turns into the same block-diagonal mask -- this needs one response per prompt (no prompt
sharing), so their layout repeats the prompt for each sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.hf_attributes import attention_settings, model_config

MASKED_BACKENDS = ("sdpa", "eager")


@dataclass
class PackedRow:
    """One packed row and where each response token's prediction is read from.

    ``columns`` (N,): the column whose output predicts each real response token, in row-major order of
    ``token_mask`` (B, R), the real response tokens (a prefix of each row).
    """

    input_ids: Tensor  # (1, L)
    position_ids: Tensor  # (1, L)
    attention_mask: Tensor | None  # (1, 1, L, L) bool (SDPA) or additive float (eager); None: from position ids
    columns: Tensor  # (N,)
    token_mask: Tensor  # (B, R) bool
    routes: Tensor | None = None  # (1, L, L', K): a sampler's routes of the row's tokens, to replay (-1: unknown)

    def scatter(self, values: Tensor) -> Tensor:
        """Per-token values in packed order back to the padded layout, zeros on padding. Shape: (N, ...) -> (B, R, ...)."""
        out = values.new_zeros(*self.token_mask.shape, *values.shape[1:])
        return out.index_put((self.token_mask,), values)


def attention_backend(model) -> str | None:
    return attention_settings(model_config(model))[0]


def packable(model, prompt_mask: Tensor, response_mask: Tensor) -> bool:
    """Whether ``pack`` applies: a transformers model with a known attention backend, no sliding window,
    non-empty prompts, and responses whose real tokens are a prefix of their row."""
    backend, window = attention_settings(model_config(model))
    if backend is None or window is not None:
        return False
    lengths = response_mask.sum(-1, keepdim=True)  # (B, 1)
    prefix = torch.arange(response_mask.shape[1], device=response_mask.device) < lengths  # (B, R)
    return bool(((response_mask != 0) == prefix).all() & (prompt_mask.sum(-1) > 0).all())


def pack(
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    response_mask: Tensor,
    backend: str | None = "sdpa",
    routes: tuple[Tensor, Tensor] | None = None,
) -> PackedRow:
    """Lay out left-padded prompts (B, P) and right-padded responses (B, R) as one packed row (see the module docstring);
    ``routes`` (the sampler's, (B, P, L, K) and (B, R, L, K)) are laid out as their tokens."""
    device = response_ids.device
    share = backend in MASKED_BACKENDS
    prompt_lengths = prompt_mask.sum(-1).tolist()
    response_lengths = response_mask.sum(-1).tolist()
    same = [False] * prompt_ids.shape[0]
    if share and prompt_ids.shape[0] > 1:
        flags = ((prompt_ids[1:] == prompt_ids[:-1]) & (prompt_mask[1:] == prompt_mask[:-1])).all(-1).tolist()
        same = [False, *flags]  # same[i]: row i reuses row i - 1's prompt
    width = prompt_ids.shape[1]
    ids, positions, segments, prompt_of, columns, routed = [], [], [], [], [], []
    offset, prompt_segment, segment = 0, -1, 0
    for i, (p, r) in enumerate(zip(prompt_lengths, response_lengths)):
        if not same[i]:  # the prompt's real tokens (left-padded: the last p columns)
            ids.append(prompt_ids[i, width - p :])
            if routes is not None:
                routed.append(routes[0][i, width - p :])
            positions.append(torch.arange(p, device=device))
            segments.append(torch.full((p,), segment, device=device))
            prompt_of.append(torch.full((p,), -1, device=device))
            prompt_segment, last_prompt_column = segment, offset + p - 1
            offset, segment = offset + p, segment + 1
        if r == 0:
            continue
        ids.append(response_ids[i, :r])
        if routes is not None:
            routed.append(routes[1][i, :r])
        positions.append(p + torch.arange(r, device=device))
        segments.append(torch.full((r,), segment, device=device))
        prompt_of.append(torch.full((r,), prompt_segment, device=device))
        # the prompt's last column predicts response token 0, response column t predicts token t + 1
        columns.append(
            torch.cat([torch.tensor([last_prompt_column], device=device), offset + torch.arange(r - 1, device=device)])
        )
        offset, segment = offset + r, segment + 1
    input_ids = torch.cat(ids)[None]  # (1, L)
    position_ids = torch.cat(positions)[None]
    mask = None
    if share:
        mask = block_causal_mask(torch.cat(segments), torch.cat(prompt_of))
        if backend == "eager":  # eager adds the mask to the scores
            mask = torch.zeros(mask.shape, device=device).masked_fill_(~mask, torch.finfo(torch.float32).min)
        mask = mask[None, None]
    token_mask = response_mask != 0
    return PackedRow(
        input_ids,
        position_ids,
        mask,
        torch.cat(columns) if columns else position_ids.new_zeros(0),
        token_mask,
        torch.cat(routed)[None] if routes is not None else None,
    )


NO_PACKING_WITH_IMAGES = (
    "model.loop.max_tokens_per_micro_batch: token-budget packing is not supported for prompts with images (its packed "
    "row has no multimodal positions, so the log-probs would be wrong); set model.loop.max_tokens_per_micro_batch: null "
    "and size the micro-batches with model.loop.micro_batch_size and forward_batch_size"
)


def refuse_images(batch: RolloutBatch) -> None:
    """Packing lays rows out with one position per token; image tokens take multimodal positions (and their images
    must follow them into the row), which this layout does not carry, so a batch with images is refused, not approximated."""
    if batch.image_inputs is not None:
        raise ValueError(NO_PACKING_WITH_IMAGES)


def block_causal_mask(segment: Tensor, prompt_of: Tensor) -> Tensor:
    """Column j sees column k when k <= j and k is in j's own segment or in the prompt j answers. Shapes: (L,), (L,) -> (L, L)."""
    length = segment.shape[0]
    column = torch.arange(length, device=segment.device)
    causal = column[None, :] <= column[:, None]  # (L, L): key <= query
    visible = (segment[None, :] == segment[:, None]) | (segment[None, :] == prompt_of[:, None])
    return causal & visible


def packed_outputs(model, row: PackedRow, hidden: bool = False) -> Tensor:
    """The model's logits (N, V), or last hidden states (N, H) with ``hidden``, at ``row.columns``: one model call."""
    kwargs = dict(
        input_ids=row.input_ids, position_ids=row.position_ids, attention_mask=row.attention_mask, use_cache=False
    )
    if hidden:
        return model(**kwargs).last_hidden_state[0, row.columns]  # (N, H)
    keep, inverse = torch.unique(row.columns, return_inverse=True)  # a group's prompt column serves G responses
    return model(**kwargs, logits_to_keep=keep).logits[0, inverse]  # (N, V)
