"""Masked reductions, whitening and group reshapes shared by every component.

Math lives once: a component that needs a masked mean or a group view imports it from here.
All reductions run in fp32 whatever the input dtype.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def dist_ready() -> bool:
    return dist.is_available() and dist.is_initialized()


def all_reduce_sum(x: Tensor) -> Tensor:
    """Sum over data-parallel ranks (identity when not distributed). Differentiable-free."""
    if dist_ready():
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def world_size() -> int:
    return dist.get_world_size() if dist_ready() else 1


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    x, mask = x.float(), mask.float()
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean over entries where ``mask`` is 1; 0 where there are none (never NaN)."""
    count = mask.float().sum() if dim is None else mask.float().sum(dim)
    return masked_sum(x, mask, dim) / count.clamp_min(1.0)


def masked_whiten(
    x: Tensor, mask: Tensor, shift_mean: bool = True, global_stats: bool = False, eps: float = 1e-8
) -> Tensor:
    """(x - mu) / sigma over masked entries (population variance), in fp32; masked entries -> 0.

    ``shift_mean=False`` rescales only, keeping the mean: a second mean shift on top of a group
    baseline changes the baseline. ``global_stats=True`` takes mu and sigma over all
    data-parallel ranks with one all-reduce of (n, sum, sum of squares).
    """
    x32, m = x.float(), mask.float()
    stats = torch.stack([m.sum(), (x32 * m).sum(), (x32 * x32 * m).sum()])
    if global_stats:
        stats = all_reduce_sum(stats)
    n = stats[0].clamp_min(1.0)
    mean = stats[1] / n
    var = (stats[2] / n - mean * mean).clamp_min(0.0)
    whitened = (x32 - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * m


def group_view(values: Tensor, group_ids: Tensor) -> Tensor:
    """Reshape per-sample ``values`` (B,) to (n_groups, G), checking groups are contiguous and equal-sized."""
    b = group_ids.shape[0]
    if b == 0:
        return values.reshape(0, 1)
    starts = torch.ones(b, dtype=torch.bool, device=group_ids.device)
    starts[1:] = group_ids[1:] != group_ids[:-1]
    n_groups = int(starts.sum())
    if torch.unique(group_ids).numel() != n_groups or b % n_groups:
        raise ValueError(f"groups must be contiguous and equal-sized; got {n_groups} groups over {b} samples")
    g = b // n_groups
    grouped_ids = group_ids.reshape(n_groups, g)
    if not bool((grouped_ids == grouped_ids[:, :1]).all()):
        raise ValueError("samples of one prompt must be contiguous and every group must have the same size")
    return values.reshape(n_groups, g)  # (n_groups, G)


def sequence_rewards(batch) -> Tensor:
    """Per-sample return: the sum of ``token_rewards`` over the model's tokens (= score minus any KL-in-reward). (B,)"""
    batch.require(["token_rewards"], "a sequence-level advantage estimator")
    return masked_sum(batch.token_rewards, batch.action_tokens, dim=-1)


def broadcast_to_tokens(per_sample: Tensor, response_mask: Tensor) -> Tensor:
    """(B,) -> (B, R) on valid tokens, 0 elsewhere."""
    return per_sample.float().unsqueeze(-1) * response_mask.float()


def steps_first(mask: Tensor) -> Tensor:
    """Per row, the positions where ``mask`` is 1 in order, then the others (a stable sort). Shape: (B, R) -> (B, R) long.

    Gathering with it makes the masked-in tokens a prefix, so a recurrence over steps (GAE, reward-to-go) skips
    the others: in a multi-turn transcript an observation is not a step, and the value after it bootstraps the
    model's last token before it. ``torch.empty_like(y).scatter_(-1, order, y)`` puts a result back."""
    return torch.sort((mask == 0).to(torch.uint8), dim=-1, stable=True).indices


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """1 - Var(returns - values) / Var(returns) over masked tokens: 1 for a perfect critic, 0 for a constant one."""
    m = mask.float()
    n = m.sum().clamp_min(1.0)

    def var(x: Tensor) -> Tensor:
        mean = (x * m).sum() / n
        return (((x - mean) ** 2) * m).sum() / n

    returns, values = returns.float(), values.float()
    return 1.0 - var(returns - values) / var(returns).clamp_min(1e-8)


def reverse_scan(x: Tensor, decay: Tensor, chunk: int = 64) -> Tensor:
    """y_t = x_t + decay_t * y_{t+1} along the last dim, with y = 0 past the end, in fp32.

    Shapes: x and decay broadcastable to (..., T) -> (..., T). The GAE and reward-to-go recurrence in
    ``chunk + T / chunk`` Python steps instead of T (128 for T = 4096): the time axis is cut into
    chunks; one backward sweep solves every chunk at once with a zero carry-in, tracking
    prod_{k >= t} decay_k to the chunk's end; a second sweep over chunk starts carries the solution
    across chunks; then y_t = local_t + prod_t * y_{start of next chunk}. Exact up to fp32 rounding
    (the same products and sums, regrouped); any decay in [0, 1] (masks with holes, per-row lambdas).
    The chunk size is fixed, not derived from T, so trailing padding (zero x, zero decay) never changes
    a bit of the result, and for T <= chunk the arithmetic is exactly the sequential loop's.
    """
    x, decay = torch.broadcast_tensors(x.float(), decay.float())
    t_len = x.shape[-1]
    if t_len == 0:
        return x.clone()
    size = min(chunk, t_len)
    n = -(-t_len // size)
    pad = n * size - t_len  # zero input and zero decay past the end: nothing flows back from there

    def steps_first(v: Tensor) -> Tensor:  # (..., T) -> (L, ..., n): each step of the sweep reads contiguous memory
        return torch.nn.functional.pad(v, (0, pad)).unflatten(-1, (n, size)).movedim(-1, 0).contiguous()

    xs, ds = steps_first(x), steps_first(decay)
    local, through = torch.empty_like(xs), torch.empty_like(xs)
    local[-1], through[-1] = xs[-1], ds[-1]
    for j in range(size - 2, -1, -1):  # every chunk at once, zero carry-in; written in place, no temporaries
        torch.mul(ds[j], local[j + 1], out=local[j]).add_(xs[j])
        torch.mul(ds[j], through[j + 1], out=through[j])
    head_local, head_through = local[0].movedim(-1, 0).contiguous(), through[0].movedim(-1, 0).contiguous()  # (n, ...)
    starts = torch.empty_like(head_local)  # (n, ...): y at each chunk's first position
    starts[-1] = head_local[-1]
    for i in range(n - 2, -1, -1):
        torch.mul(head_through[i], starts[i + 1], out=starts[i]).add_(head_local[i])
    following = torch.cat([starts[1:], torch.zeros_like(starts[:1])]).movedim(
        0, -1
    )  # (..., n): y at the next chunk's start
    y = (through * following).add_(local)  # (L, ..., n)
    return y.movedim(0, -1).flatten(-2)[..., :t_len]


def sequence_kl(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per-sample KL(pi || ref) estimate: k1 summed over the sequence (unbiased for the sequence KL). Shape: (B,)."""
    return ((logprobs - ref_logprobs) * mask).sum(-1)


def zero_variance_fraction(scores: Tensor, group_ids: Tensor, is_greedy: Tensor | None) -> Tensor:
    """Fraction of groups whose sampled responses all scored the same (they teach nothing)."""
    if is_greedy is not None:
        scores, group_ids = scores[is_greedy == 0], group_ids[is_greedy == 0]
    grouped = group_view(scores, group_ids)  # (n_groups, G)
    return ((grouped.amax(-1) - grouped.amin(-1)) <= 1e-6).float().mean()
