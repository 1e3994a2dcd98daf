"""What a model is given: positions from attention masks, prompts and responses joined for one causal pass, and
which keyword arguments a model's forward takes. The sampler and the trainer build their inputs here alike, so they
see the same positions."""

from __future__ import annotations

import functools
import inspect

import torch
from torch import Tensor


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
