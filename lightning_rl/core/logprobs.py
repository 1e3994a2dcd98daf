"""Trainer-side forward passes: log-probs of the sampled tokens and per-token entropy.

Never materialises a full fp32 ``(B, R, V)`` log-softmax: rows are processed in chunks, each cast
to fp32 on its own, and the backward pass recomputes the softmax chunk by chunk, so the only
``(B, R, V)`` tensors alive are the model's own logits and their gradient.

The sampling temperature is mirrored here (``logits / T``): the ratio and the KL must be taken
under the distribution that actually sampled the tokens (N+ implementation details, Huang et al. 2024). So is a
top-k / top-p truncation (`Truncation`): the log-probs are then renormalised over the tokens the sampler kept.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from lightning_rl.core.forward_outputs import PolicyForward, ResponseLogits, RouterLogits
from lightning_rl.core.hf_attributes import attention_settings, model_config
from lightning_rl.core.inputs import (
    check_no_placeholders,
    forward_accepts,
    image_kwargs,
    mask_positions,
    row_positions,
    sequence_inputs,
)
from lightning_rl.core.moe import RouterRecorder, experts_per_token
from lightning_rl.core.packing import attention_backend, pack, packable, packed_outputs, refuse_images
from lightning_rl.core.routes import Routes, batch_routes, replaying
from lightning_rl.core.truncation import Truncation, kept_normaliser, kept_softmax

_CHUNK_ELEMENTS = 1 << 22  # ~16 MB of fp32 per chunk


def _rows_per_chunk(vocab: int, chunk_rows: int | None) -> int:
    return chunk_rows or max(1, _CHUNK_ELEMENTS // vocab)


class _SampledLogProb(torch.autograd.Function):
    """log softmax(z / T)[target] for rows of z, chunked in both directions; renormalised over the tokens the sampler
    kept where it reported them (``support``) or else over those a `Truncation` keeps (the kept set is piecewise
    constant in z: the gradient treats it as fixed)."""

    @staticmethod
    def forward(
        ctx,
        logits: Tensor,
        targets: Tensor,
        temperature: float,
        chunk_rows: int,
        truncation: Truncation | None,
        support: Tensor | None,
    ) -> Tensor:
        out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        plain = truncation is None and support is None
        floors = None if truncation is None else torch.empty_like(out)
        norms = None if plain else torch.empty_like(out)
        for i in range(0, logits.shape[0], chunk_rows):
            rows = slice(i, i + chunk_rows)
            z = logits[rows].float() / temperature  # (c, V)
            picked = z.gather(-1, targets[rows, None]).squeeze(-1)
            if plain:
                out[rows] = picked - torch.logsumexp(z, dim=-1)
                continue
            kept = None if support is None else support[rows]
            norms[rows], floor = kept_normaliser(z, targets[rows], truncation, kept)
            if floor is not None:
                floors[rows] = floor
            out[rows] = picked - norms[rows]
        ctx.save_for_backward(logits, targets, floors, norms, support)
        ctx.temperature, ctx.chunk_rows, ctx.truncation = temperature, chunk_rows, truncation
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        logits, targets, floors, norms, support = ctx.saved_tensors
        grad = torch.empty_like(logits)
        t = ctx.temperature
        for i in range(0, logits.shape[0], ctx.chunk_rows):
            rows = slice(i, i + ctx.chunk_rows)
            g_out = grad_out[rows].float().unsqueeze(-1)  # (c, 1)
            z = logits[rows].float() / t  # (c, V)
            if norms is None:
                probs = torch.softmax(z, dim=-1)
            else:  # softmax over the kept tokens only
                kept, floor = None if support is None else support[rows], None if floors is None else floors[rows]
                probs = kept_softmax(z, targets[rows], ctx.truncation, kept, floor, norms[rows])
            # d/dz [z_y - logsumexp(z)] = onehot(y) - softmax(z), times 1/T for z = logits / T
            g = -probs * g_out
            g.scatter_add_(-1, targets[rows, None], g_out)
            grad[rows] = (g / t).to(logits.dtype)
        return grad, None, None, None, None, None


def sampled_logprobs(
    logits: Tensor,
    targets: Tensor,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
    truncation: Truncation | None = None,
    support: Tensor | None = None,
) -> Tensor:
    """Log-probs of ``targets`` under softmax(logits / T), in fp32, renormalised over the tokens the sampler kept:
    ``support`` (..., K), the ids it reported (-1 padded; a position of -1 only reports none), else the tokens
    ``truncation`` keeps (None: the whole vocabulary). Shapes: (..., V), (...) -> (...)."""
    shape = targets.shape
    flat_logits = logits.reshape(-1, logits.shape[-1])
    rows = _rows_per_chunk(logits.shape[-1], chunk_rows)
    flat_support = None if support is None else support.reshape(-1, support.shape[-1])
    out = _SampledLogProb.apply(flat_logits, targets.reshape(-1), float(temperature), rows, truncation, flat_support)
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
        parts.append(
            checkpoint(_entropy_rows, chunk, temperature, use_reentrant=False)
            if grad
            else _entropy_rows(chunk, temperature)
        )
    out = torch.cat(parts) if parts else flat.new_zeros(0, dtype=torch.float32)
    return out.reshape(logits.shape[:-1])


def _activation_checkpointing(model) -> bool:
    flag = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5 (is_gradient_checkpointing before)
    return bool(getattr(model, "is_gradient_checkpointing", False) if flag is None else flag)


def shared_prompts(prompt_ids: Tensor, prompt_mask: Tensor, image_inputs: list | None = None) -> list[int] | None:
    """Row lengths of the runs of identical consecutive prompts (a group's samples are contiguous), or None when
    no two consecutive rows share a prompt. One device-to-host copy of B - 1 flags. Shapes: (B, P), (B, P).

    With ``image_inputs`` (per row) a run also needs the same images: two prompts with same-sized images read the
    same token ids (one placeholder per image patch), whatever the pictures show."""
    if prompt_ids.shape[0] < 2:
        return None
    same = ((prompt_ids[1:] == prompt_ids[:-1]) & (prompt_mask[1:] == prompt_mask[:-1])).all(-1).tolist()  # (B - 1,)
    if image_inputs is not None:
        same = [s and _same_images(a, b) for s, a, b in zip(same, image_inputs[:-1], image_inputs[1:])]
    if not any(same):
        return None
    starts = [0] + [i + 1 for i, s in enumerate(same) if not s] + [prompt_ids.shape[0]]
    return [b - a for a, b in zip(starts[:-1], starts[1:])]


def _same_images(a: dict, b: dict) -> bool:
    return a is b or (a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a))


PACKED_ROW_MAX_TOKENS = (
    1024  # prompt + G responses per packed row; beyond, its dense (P + G R)^2 attention costs more than a call
)


def response_logits(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    response_mask: Tensor,
    image_inputs: list | None = None,
) -> Tensor:
    """Logits predicting each response token. Shape: (B, R, V). ``image_inputs``: each row's image tensors (None: text).
    (`response_outputs` gives a mixture-of-experts policy's router logits at the same positions too.)"""
    return response_outputs(model, prompt_ids, prompt_mask, response_ids, response_mask, image_inputs)[0]


def _model_call(
    model, routers: RouterRecorder | None, input_ids: Tensor, routes: Tensor | None = None, **kwargs
) -> tuple:
    """``model(input_ids=..., **kwargs)`` and, with ``routers``, the call's router logits (rows, length, L, E); with
    ``routes`` (rows, length, L, K) its routers replay them (lightning_rl.core.routes.replaying)."""
    with routers.recording() if routers is not None else nullcontext(), replaying(model, routes):
        out = model(input_ids=input_ids, **kwargs)
    return out, None if routers is None else routers.take(*input_ids.shape)


def _each(fn, logits: Tensor, router: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """``fn`` on the logits and on the router logits alike: a selection over their (rows, positions) dimensions."""
    return fn(logits), None if router is None else fn(router)


def response_outputs(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    response_mask: Tensor,
    image_inputs: list | None = None,
    routers: RouterRecorder | None = None,
    routes: Routes | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Logits predicting each response token (B, R, V) and, with ``routers``, the router logits (B, R, L, E) at the same
    positions (the position whose output predicts token t: the prompt's last for t = 0, response token t - 1 after).
    With ``routes`` every model call replays the sampler's routes at the positions it computes.

    Position ``P - 1 + t`` predicts response token ``t``; only those ``R`` positions go through
    the LM head when the model supports ``logits_to_keep``.

    Shared prefix: the samples of a group repeat one prompt, so when consecutive rows share a prompt
    the prompt runs through the model once per distinct prompt (U rows instead of B), not G times.
    Same function, same gradients (each prompt's share is summed over its rows); two layouts:

    * packed (short rows, equal groups, SDPA or eager attention): one row per group holding the prompt
      and its G responses, each without its trailing padding, with a block mask (each response sees the prompt and
      itself) and each response's own positions: one model call; padding positions get zero logits;
    * KV cache (otherwise): the prompts' forward, its cache repeated to the B rows, then the responses.

    Rows with images take their positions from `row_positions` over the whole row (the sampler's prefill computes
    the same for the prompt, and its steps continue from the last) and always run the KV-cache layout (runs of one row
    where no prompt repeats): the prompts' forward reads the images, the responses' forward reads text only, as the
    sampler's steps did, even where the policy sampled an image placeholder id.
    """
    r, b = response_ids.shape[1], response_ids.shape[0]
    runs = shared_prompts(prompt_ids, prompt_mask, image_inputs) if forward_accepts(model, "logits_to_keep") else None
    if runs is not None and image_inputs is None and len(set(runs)) == 1:
        lengths = _response_extents(response_mask)  # (B,)
        # one host sync: the widest group's response tokens (the row's width is a shape), the longest response
        width, longest = torch.stack([lengths.reshape(-1, runs[0]).sum(-1).max(), lengths.max()]).tolist()
        if _packable(model, prompt_ids.shape[1], width, longest):
            return _packed_group_logits(
                model, prompt_ids, prompt_mask, response_ids, lengths, width, runs[0], routers, routes
            )
    if runs is None and image_inputs is not None and forward_accepts(model, "logits_to_keep"):
        runs = [1] * b
    # transformers drops the cache under activation checkpointing while gradients flow: no cache sharing then
    if runs is not None and torch.is_grad_enabled() and model.training and _activation_checkpointing(model):
        runs = None
    if runs is None:
        input_ids, attention_mask, position_ids = sequence_inputs(prompt_ids, prompt_mask, response_ids, response_mask)
        kwargs = dict(attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        if image_inputs is not None:
            check_no_placeholders(model, response_ids, response_mask)
            kwargs.update(
                position_ids=row_positions(model, input_ids, attention_mask, image_inputs, prompt_ids.shape[1]),
                **image_kwargs(image_inputs, input_ids.device),
            )
        if forward_accepts(model, "logits_to_keep"):
            kwargs["logits_to_keep"] = r + 1
        whole = None if routes is None else torch.cat(routes, dim=1)  # (B, P + R, L, K)
        out, router = _model_call(model, routers, input_ids, whole, **kwargs)
        return _each(lambda x: x[:, -(r + 1) : -1], out.logits, router)  # (B, R, V), (B, R, L, E)
    input_ids, attention_mask, position_ids = sequence_inputs(prompt_ids, prompt_mask, response_ids, response_mask)
    p = prompt_ids.shape[1]
    first = torch.tensor([0] + runs[:-1], device=prompt_ids.device).cumsum(0)  # (U,): the first row of each run
    images = {}
    if image_inputs is not None:
        position_ids = row_positions(model, input_ids, attention_mask, image_inputs, p)  # (3, B, P + R)
        images = image_kwargs([image_inputs[i] for i in first.tolist()], prompt_ids.device)
    head, head_router = _model_call(
        model,
        routers,
        prompt_ids[first],
        None if routes is None else routes[0][first],
        attention_mask=prompt_mask[first],
        position_ids=position_ids[..., first, :p],
        use_cache=True,
        logits_to_keep=1,
        **images,
    )
    first_logits, first_router = _each(lambda x: x[:, -1:], head.logits, head_router)  # left-padded: -1 is the last
    cache_kw = "cache" if forward_accepts(model, "cache") else "past_key_values"
    cache = getattr(head, cache_kw)
    if len(set(runs)) == 1:  # every prompt repeated G times: repeat_interleave, whose backward is a reshape and a sum
        # (B, 1, V): predicts response token 0
        first_logits, first_router = _each(lambda x: x.repeat_interleave(runs[0], dim=0), first_logits, first_router)
        cache.batch_repeat_interleave(runs[0])
    else:
        rows = torch.repeat_interleave(
            torch.arange(len(runs), device=prompt_ids.device),
            torch.tensor(runs, device=prompt_ids.device),
            output_size=b,
        )
        first_logits, first_router = _each(lambda x: x[rows], first_logits, first_router)
        cache.reorder_cache(rows)  # an index_select: differentiable
    if r == 1:
        return first_logits, first_router
    rest, rest_router = _model_call(
        model,
        routers,
        response_ids[:, :-1],
        None if routes is None else routes[1][:, :-1],
        attention_mask=attention_mask[:, :-1],
        position_ids=position_ids[..., p:-1],
        use_cache=True,
        **{cache_kw: cache},
    )  # (B, R - 1, V): predicts response tokens 1..R-1
    logits = torch.cat([first_logits, rest.logits], dim=1)  # (B, R, V)
    return logits, None if routers is None else torch.cat([first_router, rest_router], dim=1)


def _packable(model, p: int, row_tokens: int, longest: int) -> bool:
    """The packed layout needs a custom 4D mask (SDPA / eager attention take one as is), no sliding window shorter
    than a response's real context (``p + longest``), and a short row (``p + row_tokens``: the per-call cost it saves
    matters most there)."""
    backend, window = attention_settings(model_config(model))
    if backend not in ("sdpa", "eager"):
        return False
    return p + row_tokens <= PACKED_ROW_MAX_TOKENS and (window is None or window >= p + longest)


def _response_extents(response_mask: Tensor) -> Tensor:
    """Each response's columns up to and including its last real token: what follows is padding, which no real token
    sees (`RolloutBatch.response_lengths` counts the real tokens; the two agree where the mask is a prefix, and this
    keeps any masked token inside a response). Shape: (B, R) -> (B,)."""
    r = response_mask.shape[1]
    return (response_mask.bool() * torch.arange(1, r + 1, device=response_mask.device)).amax(-1)


def _packed_group_logits(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    lengths: Tensor,
    width: int,
    g: int,
    routers: RouterRecorder | None = None,
    routes: Routes | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Each group in one row: [prompt | response 1 | ... | response G | padding], each response cut at its length,
    one model call. Shapes: (B, P), (B, R), (B,) -> (B, R, V), and with ``routers`` (B, R, L, E); ``width``: the
    longest group's response tokens. Positions past a response's length (its padding) get zero logits.

    Column j attends to column k when k <= j and k is a real prompt token or lies in j's own response
    (and always to itself, so no row of the mask is empty); response tokens take positions
    n_prompt + t, as in their own sequence. The trailing padding of each response is left out of the row: with
    responses of unequal length (most RL batches) that is most of what a row would otherwise compute.
    """
    b, p = prompt_ids.shape
    r, u, device = response_ids.shape[1], b // g, prompt_ids.device
    length = p + width
    t = torch.arange(r, device=device)
    real = t[None, :] < lengths[:, None]  # (B, R)
    offset = (lengths.reshape(u, g).cumsum(-1) - lengths.reshape(u, g)).reshape(b)  # (B,): where each response starts
    group = torch.arange(u, device=device).repeat_interleave(g)[:, None]  # (B, 1): the row of each response
    row = group.expand(b, r)[real]  # (N,)
    column = (offset[:, None] + t[None, :])[real]  # (N,): in the row's response area
    prompt_valid = prompt_mask[::g].bool()  # (U, P)
    n_prompt = prompt_valid.sum(-1)  # (U,)
    area_ids = response_ids.new_zeros(u, width).index_put_((row, column), response_ids[real])  # (U, W)
    area_block = torch.full((u, width), -2, device=device).index_put_(
        (row, column), torch.arange(b, device=device)[:, None].expand(b, r)[real]
    )  # (U, W): the response a column holds, -2 on the row's padding
    area_positions = torch.zeros(u, width, dtype=torch.long, device=device).index_put_(
        (row, column), (n_prompt.repeat_interleave(g)[:, None] + t[None, :])[real]
    )
    input_ids = torch.cat([prompt_ids[::g], area_ids], dim=1)  # (U, L)
    positions = torch.cat([mask_positions(prompt_valid), area_positions], dim=1)  # (U, L)
    block = torch.cat([torch.full((u, p), -1, device=device), area_block], dim=1)  # (U, L): -1 = prompt
    index = torch.arange(length, device=device)
    causal = index[None, :] <= index[:, None]  # (L, L): key <= query
    same_response = (block[:, :, None] == block[:, None, :]) & (block[:, None, :] >= 0)  # (U, L, L)
    prompt_key = torch.cat([prompt_valid, prompt_valid.new_zeros(u, width)], dim=1)  # (U, L)
    allowed = ((prompt_key[:, None, :] | same_response) & causal) | torch.eye(
        length, dtype=torch.bool, device=device
    )  # (U, L, L)
    if model.config._attn_implementation == "eager":  # eager adds the mask to the scores
        mask = torch.zeros(allowed.shape, device=device).masked_fill_(~allowed, torch.finfo(torch.float32).min)
    else:
        mask = allowed
    row_routes = None
    if routes is not None:  # laid out as the row: the group's prompt, then its responses' tokens
        tail = routes[1].shape[2:]
        area = routes[1].new_full((u, width, *tail), -1).index_put_((row, column), routes[1][real])
        row_routes = torch.cat([routes[0][::g], area], dim=1)  # (U, L, L', K)
    out, router = _model_call(
        model, routers, input_ids, row_routes, attention_mask=mask[:, None], position_ids=positions, use_cache=False,
        logits_to_keep=width + 1,
    )  # fmt: skip
    # kept column 0 (the prompt's last) predicts every response's token 0; kept column 1 + c, response column c,
    # predicts the token after it: token t >= 1 of a response starting at offset o comes from kept column o + t
    # (padding reads column 0, then zeroed)
    kept = torch.where(real & (t[None, :] > 0), offset[:, None] + t[None, :], 0)  # (B, R)

    def per_response(x: Tensor) -> Tensor:  # x: (U, 1 + W, ...) -> (B, R, ...)
        x = x[:, -(width + 1) :][group, kept]
        return x.masked_fill(~real.reshape(b, r, *([1] * (x.dim() - 2))), 0)

    return _each(per_response, out.logits, router)


def policy_logprobs(
    model,
    batch,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_rows: int | None = None,
    packed: bool = False,
    truncation: Truncation | None = None,
    replay_routes: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (B, R) of ``batch.response_ids`` under ``model`` and, optionally, entropy (B, R), zero on padding.
    ``truncation``: the sampler's top-k / top-p, which the log-probs are renormalised under, over the kept sets the
    sampler reported where the batch carries them (``sampling_support``); the entropy is the tempered distribution's.

    ``entropy_grad=False`` computes the entropy as a detached metric (no checkpointing cost).
    ``packed=True`` runs the samples padding-free as one packed row (lightning_rl.core.packing) when the model
    allows it; log-probs and entropy are then chunked over the real tokens only. Rows with images are refused there.
    """
    out = policy_outputs(
        model,
        batch,
        temperature,
        with_entropy,
        entropy_grad,
        chunk_rows,
        packed,
        truncation=truncation,
        replay_routes=replay_routes,
    )
    return out.logprobs, out.entropy


def policy_outputs(
    model,
    batch,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_rows: int | None = None,
    packed: bool = False,
    keep_logits: bool = False,
    keep_router_logits: bool = False,
    truncation: Truncation | None = None,
    replay_routes: bool = False,
) -> PolicyForward:
    """`policy_logprobs` as a `PolicyForward`: with ``keep_logits`` the response logits themselves (`ResponseLogits`),
    with ``keep_router_logits`` a mixture-of-experts policy's router logits at the same positions (`RouterLogits`);
    ``truncation``: the sampler's top-k / top-p, applied as it was (`lightning_rl.core.truncation`); with
    ``replay_routes`` the routers replay the sampler's routes (``batch.routed_experts``; routing replay)."""
    if packed:
        refuse_images(batch)
    reported = batch.sampling_support if truncation is not None else None  # the sampler's kept sets: its policy only
    routers = RouterRecorder(model) if keep_router_logits else None
    routes = batch_routes(batch) if replay_routes else None
    router = None
    if packed and packable(model, batch.prompt_mask, batch.response_mask):
        row = pack(
            batch.prompt_ids,
            batch.prompt_mask,
            batch.response_ids,
            batch.response_mask,
            attention_backend(model),
            routes,
        )
        with routers.recording() if routers is not None else nullcontext(), replaying(model, row.routes):
            logits = packed_outputs(model, row)  # (N, V)
        if routers is not None:
            router = routers.take(*row.input_ids.shape)[0, row.columns]  # (N, L, E)
        targets = batch.response_ids[row.token_mask]  # (N,)
        support = None if reported is None else reported[row.token_mask]  # (N, K)
        scatter, token_mask = row.scatter, row.token_mask
    else:
        logits, router = response_outputs(
            model,
            batch.prompt_ids,
            batch.prompt_mask,
            batch.response_ids,
            batch.response_mask,
            batch.image_inputs,
            routers,
            routes,
        )
        targets, support = batch.response_ids, reported  # (B, R), (B, R, K) or None
        scatter = token_mask = None
    logprobs = sampled_logprobs(logits, targets, temperature, chunk_rows, truncation, support)
    entropy = None
    if with_entropy:
        if entropy_grad:
            entropy = token_entropy(logits, temperature, chunk_rows)
        else:
            with torch.no_grad():
                entropy = token_entropy(logits.detach(), temperature, chunk_rows)
    kept = ResponseLogits(logits, float(temperature), token_mask, scatter) if keep_logits else None
    routed = None if router is None else RouterLogits(router, experts_per_token(model), token_mask, scatter)
    if scatter is not None:
        logprobs, entropy = scatter(logprobs), None if entropy is None else scatter(entropy)
    return PolicyForward(logprobs, entropy, kept, routed)
