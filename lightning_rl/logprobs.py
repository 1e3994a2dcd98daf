"""Trainer-side forward passes: log-probs of the sampled tokens and per-token entropy.

Never materialises a full fp32 ``(B, R, V)`` log-softmax: rows are processed in chunks, each cast
to fp32 on its own, and the backward pass recomputes the softmax chunk by chunk, so the only
``(B, R, V)`` tensors alive are the model's own logits and their gradient.

The sampling temperature is mirrored here (``logits / T``): the ratio and the KL must be taken
under the distribution that actually sampled the tokens (N+ implementation details, Huang et al. 2024).
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

_CHUNK_ELEMENTS = 1 << 22  # ~16 MB of fp32 per chunk


def _rows_per_chunk(vocab: int, chunk_rows: int | None) -> int:
    return chunk_rows or max(1, _CHUNK_ELEMENTS // vocab)


class _SampledLogProb(torch.autograd.Function):
    """log softmax(z / T)[target] for rows of z, chunked in both directions."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, temperature: float, chunk_rows: int) -> Tensor:
        out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        for i in range(0, logits.shape[0], chunk_rows):
            z = logits[i : i + chunk_rows].float() / temperature  # (c, V)
            picked = z.gather(-1, targets[i : i + chunk_rows, None]).squeeze(-1)
            out[i : i + chunk_rows] = picked - torch.logsumexp(z, dim=-1)
        ctx.save_for_backward(logits, targets)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        logits, targets = ctx.saved_tensors
        grad = torch.empty_like(logits)
        t = ctx.temperature
        for i in range(0, logits.shape[0], ctx.chunk_rows):
            rows = slice(i, i + ctx.chunk_rows)
            g_out = grad_out[rows].float().unsqueeze(-1)  # (c, 1)
            # d/dz [z_y - logsumexp(z)] = onehot(y) - softmax(z), times 1/T for z = logits / T
            g = -torch.softmax(logits[rows].float() / t, dim=-1) * g_out
            g.scatter_add_(-1, targets[rows, None], g_out)
            grad[rows] = (g / t).to(logits.dtype)
        return grad, None, None, None


def sampled_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0, chunk_rows: int | None = None) -> Tensor:
    """Log-probs of ``targets`` under softmax(logits / T), in fp32. Shapes: (..., V), (...) -> (...)."""
    shape = targets.shape
    flat_logits = logits.reshape(-1, logits.shape[-1])
    rows = _rows_per_chunk(logits.shape[-1], chunk_rows)
    out = _SampledLogProb.apply(flat_logits, targets.reshape(-1), float(temperature), rows)
    return out.reshape(shape)


def _entropy_rows(z: Tensor, temperature: float) -> Tensor:
    logp = torch.log_softmax(z.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def token_entropy(logits: Tensor, temperature: float = 1.0, chunk_rows: int | None = None) -> Tensor:
    """Entropy of softmax(logits / T) per position, fp32, chunked. Shape: (..., V) -> (...).

    With gradients enabled each chunk is checkpointed, so the fp32 softmax of a chunk is
    recomputed in backward instead of being kept alive for the whole batch.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    rows = _rows_per_chunk(logits.shape[-1], chunk_rows)
    grad = torch.is_grad_enabled() and logits.requires_grad
    parts = []
    for i in range(0, flat.shape[0], rows):
        chunk = flat[i : i + rows]
        parts.append(checkpoint(_entropy_rows, chunk, temperature, use_reentrant=False) if grad else _entropy_rows(chunk, temperature))
    out = torch.cat(parts) if parts else flat.new_zeros(0, dtype=torch.float32)
    return out.reshape(logits.shape[:-1])


def sequence_inputs(prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor):
    """Concatenate left-padded prompts and right-padded responses for one causal forward pass.

    Position ids come from the attention mask: with left padding, ``arange`` positions would
    shift every prompt by its padding and the trainer's log-probs would not match the sampler's.
    """
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)  # (B, P + R)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1).long()
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    return input_ids, attention_mask, position_ids


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


def _activation_checkpointing(model) -> bool:
    flag = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5 (is_gradient_checkpointing before)
    return bool(getattr(model, "is_gradient_checkpointing", False) if flag is None else flag)


def shared_prompts(prompt_ids: Tensor, prompt_mask: Tensor) -> list[int] | None:
    """Row lengths of the runs of identical consecutive prompts (a group's samples are contiguous), or None when
    no two consecutive rows share a prompt. One device-to-host copy of B - 1 flags. Shapes: (B, P), (B, P)."""
    if prompt_ids.shape[0] < 2:
        return None
    same = ((prompt_ids[1:] == prompt_ids[:-1]) & (prompt_mask[1:] == prompt_mask[:-1])).all(-1).tolist()  # (B - 1,)
    if not any(same):
        return None
    starts = [0] + [i + 1 for i, s in enumerate(same) if not s] + [prompt_ids.shape[0]]
    return [b - a for a, b in zip(starts[:-1], starts[1:])]


def response_logits(model, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor) -> Tensor:
    """Logits predicting each response token. Shape: (B, R, V).

    Position ``P - 1 + t`` predicts response token ``t``; only those ``R`` positions go through
    the LM head when the model supports ``logits_to_keep``.

    Shared prefix: the samples of a group repeat one prompt, so when consecutive rows share a prompt
    the prompt runs through the model once per distinct prompt (U rows instead of B), its KV cache is
    repeated to the B rows, and only the responses run at full batch. Same function, same gradients
    (the repeat's backward sums each prompt's share over its rows); with G samples per prompt the
    prompt's forward and backward cost drops G times.
    """
    r, b = response_ids.shape[1], response_ids.shape[0]
    # transformers drops the cache under activation checkpointing while gradients flow: no sharing then
    checkpointing = torch.is_grad_enabled() and model.training and _activation_checkpointing(model)
    runs = shared_prompts(prompt_ids, prompt_mask) if forward_accepts(model, "logits_to_keep") and not checkpointing else None
    if runs is None:
        input_ids, attention_mask, position_ids = sequence_inputs(prompt_ids, prompt_mask, response_ids, response_mask)
        kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        if forward_accepts(model, "logits_to_keep"):
            kwargs["logits_to_keep"] = r + 1
        logits = model(**kwargs).logits
        return logits[:, -(r + 1) : -1]  # (B, R, V)
    _, attention_mask, position_ids = sequence_inputs(prompt_ids, prompt_mask, response_ids, response_mask)
    p = prompt_ids.shape[1]
    first = torch.tensor([0] + runs[:-1], device=prompt_ids.device).cumsum(0)  # (U,): the first row of each run
    head = model(input_ids=prompt_ids[first], attention_mask=prompt_mask[first], position_ids=position_ids[first, :p], use_cache=True, logits_to_keep=1)
    cache_kw = "cache" if forward_accepts(model, "cache") else "past_key_values"
    cache = getattr(head, cache_kw)
    if len(set(runs)) == 1:  # every prompt repeated G times: repeat_interleave, whose backward is a reshape and a sum
        first_logits = head.logits.repeat_interleave(runs[0], dim=0)  # (B, 1, V): predicts response token 0
        cache.batch_repeat_interleave(runs[0])
    else:
        rows = torch.repeat_interleave(torch.arange(len(runs), device=prompt_ids.device), torch.tensor(runs, device=prompt_ids.device), output_size=b)
        first_logits = head.logits[rows]
        cache.reorder_cache(rows)  # an index_select: differentiable
    if r == 1:
        return first_logits
    rest = model(
        input_ids=response_ids[:, :-1], attention_mask=attention_mask[:, :-1], position_ids=position_ids[:, p:-1],
        use_cache=True, **{cache_kw: cache},
    ).logits  # (B, R - 1, V): predicts response tokens 1..R-1
    return torch.cat([first_logits, rest], dim=1)  # (B, R, V)


def policy_logprobs(
    model,
    batch,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_rows: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (B, R) of ``batch.response_ids`` under ``model`` and, optionally, entropy (B, R).

    ``entropy_grad=False`` computes the entropy as a detached metric (no checkpointing cost).
    """
    logits = response_logits(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
    logprobs = sampled_logprobs(logits, batch.response_ids, temperature, chunk_rows)
    entropy = None
    if with_entropy:
        if entropy_grad:
            entropy = token_entropy(logits, temperature, chunk_rows)
        else:
            with torch.no_grad():
                entropy = token_entropy(logits.detach(), temperature, chunk_rows)
    return logprobs, entropy
