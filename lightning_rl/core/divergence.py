"""Reverse KL from the policy to a teacher at each response position, from the policy's logits, chunked in fp32.

    KL(p || q) = sum_v p(v) (log p(v) - log q(v)),    p = softmax(z / T) the policy (sampling temperature T), q the teacher

`exact_reverse_kl` sums over the whole vocabulary, with its gradient written out (never a second (N, V) graph):

    d KL / d z_j = p_j (log p_j - log q_j - KL) / T

`topk_reverse_kl` takes the teacher's k most likely tokens and puts the rest of each distribution in one bucket:
the KL between the two distributions over those k + 1 events. It never exceeds the full KL (coarsening cannot increase
a divergence; here up to rounding) and equals it when k covers the vocabulary. Both process rows in chunks, each cast
to fp32 on its own, so the only (N, V) tensors alive are the policy's own logits and their gradient (and, for the
exact KL, the teacher's).

The teacher's rest bucket, 1 - sum_i q_i over its k log-probs x_i, is taken in fp64 as
``-expm1(x_max) - sum_{i != max} exp(x_i)``: where the top-k mass is within float32 rounding of 1 (a confident teacher,
the common case on a trained one), ``1 - exp(logsumexp(x))`` in float32 is 0 and its log is meaningless (a clamp to
float32's tiny made it -87.3 and the value several times the full KL). The bucket is then floored at 2^-24, the
resolution of a float32 log-softmax near 0: a server's log-prob of exactly 0.0 says only that the rest weighs less
than that, and the largest mass the rounding allows keeps the value below the full KL (a larger bucket can only lower
p_rest log(p_rest / q_rest)). A teacher's rest lighter than 2^-24 is therefore counted as 2^-24.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

_CHUNK_ELEMENTS = 1 << 22  # ~16 MB of fp32 per chunk
_EMPTY = -1e30  # a logit for "no such token": exp underflows to 0 with finite gradients (-inf would give NaN ones)
REST_FLOOR = 2.0**-24  # the least rest-bucket mass of the teacher: float32 log-softmax's resolution near 0


def _rows(vocab: int, chunk_rows: int | None) -> int:
    return chunk_rows or max(1, _CHUNK_ELEMENTS // vocab)


class _ExactReverseKL(torch.autograd.Function):
    """KL(softmax(z / T) || softmax(t)) per row, chunked in both directions; no gradient to the teacher's logits t."""

    @staticmethod
    def forward(ctx, logits: Tensor, teacher_logits: Tensor, temperature: float, chunk_rows: int) -> Tensor:
        out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        for i in range(0, logits.shape[0], chunk_rows):
            logp = torch.log_softmax(logits[i : i + chunk_rows].float() / temperature, dim=-1)  # (c, V)
            logq = torch.log_softmax(teacher_logits[i : i + chunk_rows].float(), dim=-1)  # (c, V)
            out[i : i + chunk_rows] = (logp.exp() * (logp - logq)).sum(-1)
        ctx.save_for_backward(logits, teacher_logits, out)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        logits, teacher_logits, kl = ctx.saved_tensors
        grad = torch.empty_like(logits)
        t = ctx.temperature
        for i in range(0, logits.shape[0], ctx.chunk_rows):
            rows = slice(i, i + ctx.chunk_rows)
            logp = torch.log_softmax(logits[rows].float() / t, dim=-1)  # (c, V)
            logq = torch.log_softmax(teacher_logits[rows].float(), dim=-1)
            g = logp.exp() * (logp - logq - kl[rows, None]) * (grad_out[rows].float() / t).unsqueeze(-1)
            grad[rows] = g.to(logits.dtype)
        return grad, None, None, None


def exact_reverse_kl(
    logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0, chunk_rows: int | None = None
) -> Tensor:
    """KL(softmax(logits / T) || softmax(teacher_logits)) at each position, fp32. Shapes: (..., V), (..., V) -> (...).

    ``teacher_logits`` are the teacher's own (already divided by its temperature); they get no gradient."""
    if teacher_logits.shape != logits.shape:
        raise ValueError(
            f"the exact reverse KL compares two distributions over one vocabulary: the policy's logits are "
            f"{tuple(logits.shape)}, the teacher's {tuple(teacher_logits.shape)}; a teacher with another vocabulary "
            "width can use the top-k variant"
        )
    flat, teacher = logits.reshape(-1, logits.shape[-1]), teacher_logits.reshape(-1, logits.shape[-1]).detach()
    out = _ExactReverseKL.apply(flat, teacher, float(temperature), _rows(logits.shape[-1], chunk_rows))
    return out.reshape(logits.shape[:-1])


def _topk_rows(z: Tensor, ids: Tensor, teacher_logprobs: Tensor, temperature: float) -> Tensor:
    z = z.float() / temperature  # (c, V)
    lse = torch.logsumexp(z, dim=-1, keepdim=True)  # (c, 1)
    logp = z.gather(-1, ids) - lse  # (c, K): the policy's log-probs of the teacher's top k
    logp_rest = torch.logsumexp(z.scatter(-1, ids, _EMPTY), dim=-1) - lse.squeeze(-1)  # (c,): everything else
    logq = teacher_logprobs.float()
    logq_rest = teacher_rest_logprob(teacher_logprobs).float()  # (c,)
    return (logp.exp() * (logp - logq)).sum(-1) + logp_rest.exp() * (logp_rest - logq_rest)


def teacher_rest_logprob(teacher_logprobs: Tensor) -> Tensor:
    """log(1 - sum_i exp(x_i)) over the last dimension, in fp64, floored at log 2^-24 (module docstring). Shape:
    (..., K) -> (...)."""
    x = teacher_logprobs.double()
    top = x.argmax(-1, keepdim=True)  # (..., 1)
    others = x.exp().scatter(-1, top, 0.0).sum(-1)  # (...,): every mass but the largest, small terms summed alone
    rest = -torch.expm1(x.gather(-1, top).squeeze(-1)) - others  # 1 - q_max - others, without forming 1 - ...
    return rest.clamp_min(REST_FLOOR).log()


def topk_reverse_kl(
    logits: Tensor, ids: Tensor, teacher_logprobs: Tensor, temperature: float = 1.0, chunk_rows: int | None = None
) -> Tensor:
    """KL over the teacher's top-k tokens and one bucket for the rest, fp32. Shapes: (..., V), (..., K), (..., K) -> (...).

    ``teacher_logprobs``: the teacher's log-probs of ``ids`` (its own distribution, already tempered); the rest bucket
    holds 1 - their total mass. Each chunk is recomputed in backward (activation checkpointing) when gradients flow."""
    vocab, k = logits.shape[-1], ids.shape[-1]
    flat, flat_ids, flat_q = logits.reshape(-1, vocab), ids.reshape(-1, k), teacher_logprobs.reshape(-1, k).detach()
    rows = _rows(vocab, chunk_rows)
    grad = torch.is_grad_enabled() and logits.requires_grad
    parts = []
    for i in range(0, flat.shape[0], rows):
        args = (flat[i : i + rows], flat_ids[i : i + rows], flat_q[i : i + rows], float(temperature))
        parts.append(checkpoint(_topk_rows, *args, use_reentrant=False) if grad else _topk_rows(*args))
    out = torch.cat(parts) if parts else flat.new_zeros(0, dtype=torch.float32)
    return out.reshape(logits.shape[:-1])
