"""What a model is given: positions from attention masks, prompts and responses joined for one causal pass, and
which keyword arguments a model's forward takes. The sampler and the trainer build their inputs here alike, so they
see the same positions."""

from __future__ import annotations

import functools
import inspect

import torch
from torch import Tensor

from lightning_rl.core.hf_attributes import child, image_token_id, model_config


def mask_positions(attention_mask: Tensor) -> Tensor:
    """Position ids from the attention mask (the running count of real tokens). Shape: (B, T) -> (B, T).

    With left padding, ``arange`` positions would shift every prompt by its padding and the trainer's
    log-probs would not match the sampler's.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def sequence_inputs(prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor):
    """Concatenate left-padded prompts and right-padded responses for one causal forward pass (positions: `mask_positions`)."""
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)  # (B, P + R)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1).long()
    return input_ids, attention_mask, mask_positions(attention_mask)


def forward_accepts(model, name: str) -> bool:
    """Whether ``model.forward`` takes the keyword ``name`` (e.g. ``logits_to_keep``, ``cache``); read once per forward function."""
    fn = model.forward
    return name in _forward_parameters(getattr(fn, "__func__", fn))


@functools.lru_cache(maxsize=64)
def _forward_parameters(fn) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return frozenset()


def image_kwargs(image_inputs: list[dict[str, Tensor]] | None, device: torch.device) -> dict[str, Tensor]:
    """The image tensors of a set of rows as a forward's keywords: each name's per-row tensors (``pixel_values``,
    ``image_grid_thw``, ...) concatenated along dim 0 in row order, the order in which the model fills the image tokens
    of ``input_ids``; {} when no row has an image. A row without images has an empty entry."""
    if not image_inputs:
        return {}
    names = list(dict.fromkeys(name for entry in image_inputs for name in entry))
    return {name: torch.cat([entry[name] for entry in image_inputs if name in entry]).to(device) for name in names}


def rope_index(model):
    """The model's own multimodal rotary positions (Qwen2-VL / Qwen2.5-VL's ``get_rope_index``: 3-D positions, time,
    height and width, for image tokens), or None for a model whose positions are one index per token."""
    for owner in (model, child(model, "model")):
        fn = getattr(owner, "get_rope_index", None)
        if callable(fn):
            return fn
    return None


def row_positions(
    model,
    input_ids: Tensor,
    attention_mask: Tensor,
    image_inputs: list[dict[str, Tensor]] | None = None,
    prompt_width: int | None = None,
) -> Tensor:
    """Position ids of a set of rows, as the sampler's prefill and the trainer's forward both take them. Shapes:
    (B, T) -> (B, T), the running count of real tokens (`mask_positions`); or, for rows with image inputs on a model with
    multimodal rotary positions, (3, B, T) from the model's ``get_rope_index`` (an image's tokens take their grid's
    height and width, the text after it continues from the largest). Padding takes position 0. ``prompt_width``: the
    columns after it are sampled text, even where the policy sampled an image placeholder id (the sampler's steps
    give every token a text position).

    Computed explicitly rather than left to the model: a Qwen2-VL model otherwise caches ``rope_deltas`` from its last
    prefill and reuses them in the next forward with a cache, so the positions would depend on what ran before."""
    fn = rope_index(model) if image_inputs is not None else None
    if fn is None:
        return mask_positions(attention_mask)
    grids = [entry["image_grid_thw"] for entry in image_inputs if "image_grid_thw" in entry]
    token_types = torch.zeros_like(input_ids, dtype=torch.int)
    token_types[..., :prompt_width][input_ids[..., :prompt_width] == image_token_id(model_config(model))] = 1
    positions, _ = fn(
        input_ids,
        mm_token_type_ids=token_types,
        image_grid_thw=torch.cat(grids).to(input_ids.device) if grids else None,
        attention_mask=attention_mask,
    )
    return positions  # (3, B, T)


def last_positions(positions: Tensor) -> Tensor:
    """The position of each row's last token, kept as a column: (B, T) -> (B, 1), (3, B, T) -> (3, B, 1). The next token
    a sampler appends takes this + 1 in every dimension (text after the images advances all three alike)."""
    return positions[..., -1:]


def check_no_placeholders(model, response_ids: Tensor, response_mask: Tensor) -> None:
    """A forward over whole rows (prompt and response) with images fills every image placeholder id with image features:
    a response in which the policy sampled one (the sampler read it as a token) cannot be scored that way; say so."""
    image_token = image_token_id(model_config(model))
    if image_token is not None and bool(((response_ids == image_token) & (response_mask != 0)).any()):
        raise ValueError(
            f"the policy sampled its image placeholder token (id {image_token}) in a response, which a forward over whole rows with "
            "images would fill with image features; with gradient checkpointing (model.policy.gradient_checkpointing) "
            "such a response cannot be scored exactly: turn gradient checkpointing off, or add the id to the rollout's stop_token_ids"
        )
