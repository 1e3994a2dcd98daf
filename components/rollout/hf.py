"""`HFRollout`: sampling on the policy itself, a transformers causal LM with its KV cache (the embedded default).

Left-padded prompts; ``group_size`` samples per prompt laid out contiguously. Each prompt is
prefilled once and its KV cache repeated to its samples; then one token per step for the rows still
running (finished rows leave the cache), drawn so that dropping rows does not change the tokens.
The loop is ours rather than ``model.generate``: it samples exactly what the config says
(temperature, top-k, top-p through transformers' own warpers; no hidden ``generation_config``
defaults such as a repetition penalty the trainer would not mirror), and on a small model it
avoids ``generate``'s per-step bookkeeping (about a quarter of the rollout time on CPU). For one
seed it draws the same tokens as ``generate`` (tests/components/test_rollout_hf.py).
The weights are the trainer's own, so ``sync_weights`` has nothing to copy. A call made inside
``components.rollout.interrupt.interruptible(stop)`` ends (``SamplingInterrupted``) within a decoding step of
``stop()`` turning true (an agent episode's deadline, a cancel); with sharded weights it runs to its end (the ranks
step together).

A mixture-of-experts policy's routes (the experts each router chose for each token the sampler fed it) come back as
``routed_experts`` / ``prompt_routed_experts`` (lightning_rl.core.batch.ROUTES), for routing replay and
``moe/route_agreement``. ``dtype: bfloat16`` samples from a copy of the policy in that precision (refreshed from the
policy's weights at every call), as an engine runs it, so the sampler/trainer gap can be produced and studied on a CPU.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from typing import Literal

import torch
from torch import Tensor, nn

from lightning_rl.core.batch import Prompts, RolloutBatch
from lightning_rl.core.contracts import Rollout
from lightning_rl.core.inputs import forward_accepts, image_kwargs, last_positions, row_positions
from lightning_rl.core.moe import is_moe
from lightning_rl.core.routes import RouteRecorder
from lightning_rl.core.sampling_params import SamplingParams

from .base import configured_params, response_mask_from_eos
from .interrupt import check_interrupted
from .kv_cache import grow_in_place

IN_PLACE_FROM = 16
"""Responses this long (``max_new_tokens``) or longer decode on the in-place KV cache (`kv_cache`); for shorter
ones the cache's conversion costs more than the concatenations it saves (the shipped tiny policy, 8 new tokens: 8%
more per call; 16: even; 64: 12% less; a 30M policy at 128: a fifth less)."""


class HFRollout(Rollout):
    """Sample from the policy with a KV cache, ``max_new_tokens`` steps at most.

    With ``top_p``/``top_k`` the trainer mirrors the truncation in its log-probs as it mirrors the temperature
    (`lightning_rl.core.truncation`: transformers' warpers keep the tokens vLLM's rule keeps).
    """

    def __init__(
        self,
        group_size: int = 8,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stop_token_ids: list[int] | None = None,
        greedy_baseline: bool = False,
        return_logprobs: bool = False,
        generation_batch_size: int | None = None,
        drop_finished_rows: bool = True,
        ignore_eos: bool = False,
        record_routes: bool = True,
        dtype: str | None = None,
        draw: Literal["multinomial", "inverse_cdf"] = "multinomial",
    ):
        """
        Args:
            group_size: responses sampled per prompt (G).
            max_new_tokens: length cap; a response that reaches it without EOS is ``truncated``.
            temperature: sampling temperature; 0 means greedy.
            top_p: nucleus sampling mass (1.0 = off).
            top_k: top-k sampling (0 = off).
            stop_token_ids: extra token ids that end a response, besides the tokenizer's EOS.
            greedy_baseline: also decode one greedy response per prompt, appended to its group and
                flagged ``is_greedy`` (the ReMax baseline); it never enters the loss.
            return_logprobs: fill ``rollout_logprobs`` with the sampler's log-prob of each sampled token:
                log_softmax(z / T) renormalised over the tokens top-k / top-p kept (vLLM's processed log-probs).
            generation_batch_size: sequences sampled together, in whole groups (at least one prompt's
                group_size samples; None = all at once).
            drop_finished_rows: stop computing rows whose response has ended (they leave the KV cache once a
                quarter of the rows has), so a batch costs about the sum of its lengths; same tokens either way.
            ignore_eos: the tokenizer's EOS does not end a response (benchmarks: every response ``max_new_tokens``
                long unless a stop token ends it).
            record_routes: record a mixture-of-experts policy's routes (``routed_experts``; nothing for a dense one).
                Named apart from the server rollouts' ``return_routes`` (off there by default: the server needs a
                flag), so a preset that swaps the rollout class carries neither over.
            dtype: sample from a copy of the policy in this precision (``bfloat16``, what engines run; None = the
                policy itself). Costs a copy of the weights, refreshed at every call.
            draw: how a token is drawn from its distribution. ``multinomial``: ``torch.multinomial``, as transformers'
                ``generate`` draws (the same tokens for one seed), which spends an exponential random number per
                vocabulary entry and row (on a CPU a fifth of a 30M policy's decoding step at an 8k vocabulary, more
                than the forward itself at 150k); ``inverse_cdf``: one uniform number per row, located in the row's
                cumulative distribution (summed in float64): the same distribution, other tokens for a seed.
        """
        if draw not in ("multinomial", "inverse_cdf"):
            raise ValueError(f"HFRollout draw {draw!r}: use multinomial or inverse_cdf")
        if dtype is not None and not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"HFRollout dtype {dtype!r} is not a torch dtype: use bfloat16, float16 or float32")
        self.params = configured_params(
            "HFRollout", group_size, max_new_tokens, temperature, top_p, top_k, stop_token_ids, greedy_baseline,
            ignore_eos,
        )  # fmt: skip
        self.return_logprobs = return_logprobs
        self.generation_batch_size = generation_batch_size
        self.drop_finished_rows = drop_finished_rows
        self.record_routes, self.dtype, self.draw = record_routes, dtype, draw
        self._copy: nn.Module | None = None
        self.provides = (
            Rollout.provides
            | ({"rollout_logprobs"} if return_logprobs else set())
            | ({"routed_experts"} if record_routes else set())
            | ({"is_greedy", "sample_mask"} if greedy_baseline else set())
        )

    @staticmethod
    def _truncation(params: SamplingParams):
        """Top-k then top-p, after the temperature: the order transformers' generate applies them in."""
        from transformers.generation import LogitsProcessorList, TopKLogitsWarper, TopPLogitsWarper

        return LogitsProcessorList(
            ([TopKLogitsWarper(params.top_k)] if params.top_k > 0 else [])
            + ([TopPLogitsWarper(params.top_p)] if params.top_p < 1.0 else [])
        )

    def _pick(self, logits: Tensor, scores: Tensor | None, rows: Tensor, batch: int) -> Tensor:
        """Next tokens of the ``rows`` still computed, from their fp32 logits (b, V) and, when sampling, their tempered
        and truncated scores (b, V; None: greedy); pad for the others. Shape: -> (batch,).

        The draw is made for all ``batch`` rows (finished ones on a point mass), so the random numbers each row
        consumes do not depend on which rows are still computed: dropping finished rows leaves the tokens as they were.
        """
        token = torch.full((batch,), self.pad_token_id, dtype=torch.long, device=logits.device)
        if scores is None:
            return token.index_put_((rows,), logits.argmax(-1))
        probs = torch.zeros(batch, logits.shape[-1], device=logits.device)
        probs[:, self.pad_token_id] = 1.0
        probs[rows] = torch.softmax(scores, dim=-1)
        if self.draw == "inverse_cdf":
            return inverse_cdf_draw(probs)
        return torch.multinomial(probs, num_samples=1).squeeze(1)

    def _sample(
        self,
        policy: nn.Module,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        params: SamplingParams,
        temperature: float,
        repeats: int = 1,
        image_inputs: list | None = None,
    ):
        """``repeats`` responses per prompt row (rows of one prompt contiguous), in chunks of whole groups; ``image_inputs``:
        each prompt row's image tensors (None: text only). Returns response ids (rows, R) right-padded with pad, the
        sampler's log-probs (rows, R) or None, and an MoE policy's routes, prompt (rows, P, L, K) and response
        (rows, R, L, K), or None."""
        per_call = max(1, (self.generation_batch_size or prompt_ids.shape[0] * repeats) // repeats)  # prompts per chunk
        forward = _Forward(policy, self.record_routes and is_moe(policy))
        # inference mode skips autograd's version and view bookkeeping on every op; sharded weights keep no_grad, their
        # all-gathered parameters must stay ordinary tensors
        with torch.no_grad() if forward.synced else torch.inference_mode():
            parts = [
                self._sample_chunk(
                    forward,
                    prompt_ids[i : i + per_call],
                    prompt_mask[i : i + per_call],
                    params,
                    temperature,
                    repeats,
                    None if image_inputs is None else image_inputs[i : i + per_call],
                )
                for i in range(0, prompt_ids.shape[0], per_call)
            ]
            width = max(part[0].shape[1] for part in parts)
            response_ids = torch.cat(
                [nn.functional.pad(part[0], (0, width - part[0].shape[1]), value=self.pad_token_id) for part in parts]
            )
            logprobs = (
                torch.cat([nn.functional.pad(part[1], (0, width - part[1].shape[1])) for part in parts])
                if self.return_logprobs
                else None
            )
            routes = None
            if forward.routes is not None:
                routes = (
                    torch.cat([part[2] for part in parts]),  # (rows, P, L, K): every chunk has the prompts' width
                    torch.cat([_pad_routes(part[3], width) for part in parts]),  # (rows, R, L, K)
                )
        # ordinary tensors again: the trainer's forward and loss save these for backward
        return (
            response_ids.clone(),
            None if logprobs is None else logprobs.clone(),
            None if routes is None else tuple(x.clone() for x in routes),
        )

    def _sample_chunk(
        self,
        forward: _Forward,
        ids: Tensor,
        mask: Tensor,
        params: SamplingParams,
        temperature: float,
        repeats: int,
        images: list | None = None,
    ):
        if not forward.synced:
            check_interrupted()
        positions = row_positions(
            forward.policy, ids, mask, images
        )  # (n, P), or (3, n, P) with multimodal rotary positions
        logits, cache = forward.prefill(ids, mask, positions, images)  # (n, V)
        if repeats > 1:  # prefill draws no random numbers: the samples are those of repeated prompts
            logits = logits.repeat_interleave(repeats, dim=0)  # (b, V)
            cache.batch_repeat_interleave(repeats)
        if params.max_new_tokens >= IN_PLACE_FROM:  # the steps write in place instead of concatenating
            grow_in_place(cache, ids.shape[1] + params.max_new_tokens)
        prompt_routes, step_routes = None, []
        if forward.routes is not None:  # (n, P, L, K) -> (b, P, L, K), -1 on padding
            prompt_routes = forward.routes.take(*ids.shape).masked_fill(mask[..., None, None] == 0, -1)
            prompt_routes = prompt_routes.repeat_interleave(repeats, dim=0)
        attention = mask.repeat_interleave(repeats, dim=0)  # (b, P + t)
        position = last_positions(positions).repeat_interleave(repeats, dim=-2)  # (b, 1) or (3, b, 1)
        eos = torch.tensor(params.eos_ids(self.eos_token_id), dtype=torch.long, device=ids.device)
        truncation = self._truncation(params)
        batch = attention.shape[0]
        running = torch.ones(batch, dtype=torch.bool, device=ids.device)  # (batch,)
        rows = torch.arange(batch, device=ids.device)  # (b,): the rows still in the cache (and in logits)
        tokens, logprobs = [], []
        step, done = 0, False
        while True:
            if not forward.synced:  # a sharded policy's ranks step together: one cannot leave alone
                check_interrupted()
            if not done:
                z = logits.float()  # (b, V)
                # tempered, then top-k / top-p (-inf where dropped): the distribution drawn from; greedy: None
                scores = truncation(None, z / temperature) if temperature > 0 else None  # the warpers read the scores
                token = torch.where(running, self._pick(z, scores, rows, batch), self.pad_token_id)  # finished: pad
                tokens.append(token)
                if self.return_logprobs:  # greedy: untempered
                    picked = torch.log_softmax(z if scores is None else scores, dim=-1).gather(-1, token[rows, None])
                    # a finished row took pad, which the truncation may have dropped (-inf): 0 there, as on padding
                    picked = picked.squeeze(-1).masked_fill(~running[rows], 0.0)
                    logprobs.append(z.new_zeros(batch).index_put_((rows,), picked))
                running &= ~torch.isin(token, eos)
                step += 1
                left = int(running.sum())  # one host sync per step, as generate's
                done = step == params.max_new_tokens or left == 0
                if not done and self.drop_finished_rows and not forward.synced and left <= 0.75 * rows.shape[0]:
                    # a quarter of the computed rows has finished: copy the cache once without them
                    keep = running[rows].nonzero().squeeze(1)  # (b',) positions in the cache
                    cache.reorder_cache(keep)
                    rows, attention, position = rows[keep], attention[keep], position[..., keep, :]
            if not forward.any_rank_running(not done):
                break
            attention = torch.cat([attention, attention.new_ones(attention.shape[0], 1)], dim=1)
            position = position + 1
            logits = forward.step(token[rows], attention, position, cache)
            if forward.routes is not None:  # the routes of the token just fed, for the rows computed
                fed = forward.routes.take(rows.shape[0], 1)[:, 0]  # (b', L, K)
                step_routes.append(fed.new_full((batch, *fed.shape[1:]), -1).index_put_((rows,), fed))
        response_ids = torch.stack(tokens, dim=1)  # (batch, R)
        routes = None
        if forward.routes is not None:  # the last token sampled is never fed: no route
            fed = step_routes[: len(tokens) - 1]
            none = prompt_routes.new_full((batch, 1, *prompt_routes.shape[2:]), -1)
            routes = torch.cat([torch.stack(fed, dim=1), none], dim=1) if fed else none  # (batch, R, L, K)
        return response_ids, (torch.stack(logprobs, dim=1) if self.return_logprobs else None), prompt_routes, routes

    def generate(self, prompts: Prompts, policy: nn.Module, params: SamplingParams | None = None) -> RolloutBatch:
        params = params or self.params
        n_prompts, g, rows = len(prompts), params.samples_per_prompt, params.rows_per_prompt
        prompt_ids, prompt_mask = prompts.prompt_ids, prompts.prompt_mask
        sampler = self._sampler(policy)
        was_training = sampler.training
        sampler.eval()
        try:
            images = prompts.image_inputs
            response_ids, logprobs, routes = self._sample(
                sampler, prompt_ids, prompt_mask, params, params.sampling_temperature, repeats=g, image_inputs=images
            )  # (P_n * G, R)
            if params.with_baseline:
                greedy_ids, greedy_logprobs, greedy_routes = self._sample(
                    sampler, prompt_ids, prompt_mask, params, 0.0, image_inputs=images
                )
                response_ids = _append_to_groups(response_ids, greedy_ids, g, self.pad_token_id)
                if logprobs is not None:
                    logprobs = _append_to_groups(logprobs, greedy_logprobs, g, 0.0)
                if routes is not None:
                    routes = tuple(_append_to_groups(a, b, g, -1) for a, b in zip(routes, greedy_routes))
        finally:
            sampler.train(was_training)
        response_mask, truncated = response_mask_from_eos(response_ids, params.eos_ids(self.eos_token_id))
        if routes is not None:  # a row's tokens after its end were never its own
            routes = (routes[0], routes[1].masked_fill(response_mask[..., None, None] == 0, -1))
        is_greedy = (
            (torch.arange(rows, device=prompt_ids.device) == g).repeat(n_prompts) if params.with_baseline else None
        )
        return RolloutBatch(
            **prompts.per_row(rows),
            response_ids=response_ids,
            response_mask=response_mask,
            rollout_logprobs=None if logprobs is None else logprobs * response_mask,
            truncated=truncated,
            group_ids=torch.arange(n_prompts, device=prompt_ids.device).repeat_interleave(rows),
            is_greedy=is_greedy,
            sample_mask=None if is_greedy is None else (is_greedy == 0).float(),
            versions=torch.full((n_prompts * rows,), self.weight_version, dtype=torch.long, device=prompt_ids.device),
            prompt_routed_experts=None if routes is None else routes[0],
            routed_experts=None if routes is None else routes[1],
        )

    def _sampler(self, policy: nn.Module) -> nn.Module:
        """The model that samples: the policy, or its copy in ``dtype`` holding the policy's current weights."""
        dtype = None if self.dtype is None else getattr(torch, self.dtype)
        if dtype is None or next(policy.parameters()).dtype == dtype:
            return policy
        if _sharded(policy):
            raise ValueError(
                f"HFRollout dtype {self.dtype!r}: a sharded policy (FSDP2, ZeRO-3) cannot be copied whole; set dtype: null"
            )
        if self._copy is None:
            self._copy = copy.deepcopy(policy).to(dtype)
            self._copy.requires_grad_(False)
        else:
            with torch.no_grad():
                for mine, theirs in zip(self._copy.parameters(), policy.parameters()):
                    mine.copy_(theirs)  # cast to dtype
        return self._copy


def inverse_cdf_draw(probs: Tensor) -> Tensor:
    """One token per row of ``probs`` (b, V): the first index whose cumulative probability exceeds u * total, u uniform
    on [0, 1). Token k is drawn when cdf[k-1] <= u * total < cdf[k], with probability p_k / total; the sum runs in
    float64, so for any V the draw's probabilities are the row's to ~1e-16, and a token of probability 0 is never
    drawn. Shape: -> (b,)."""
    cdf = probs.double().cumsum(dim=-1)  # (b, V)
    u = torch.rand(probs.shape[0], 1, dtype=torch.float64, device=probs.device) * cdf[:, -1:]  # (b, 1)
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)


class _Forward:
    """The policy's forward for sampling: a prefill, then one token per step on its KV cache.

    With sharded weights (FSDP2, DeepSpeed ZeRO-3) every forward is a collective, so a rank whose
    responses have all ended keeps stepping (its tokens are dropped) until every rank has finished,
    as transformers' ``synced_gpus``; otherwise it stops at once.
    """

    def __init__(self, policy: nn.Module, routes: bool = False):
        """``routes``: record the experts a mixture-of-experts policy's routers choose (`routes`, per call)."""
        self.policy = policy
        self.routes = RouteRecorder(policy) if routes else None
        self.cache_kw = "cache" if forward_accepts(policy, "cache") else "past_key_values"  # transformers 5 renamed it
        self.keep_last = {"logits_to_keep": 1} if forward_accepts(policy, "logits_to_keep") else {}
        self.synced = _sharded(policy)

    def prefill(
        self, ids: Tensor, mask: Tensor, positions: Tensor, images: list | None = None
    ) -> tuple[Tensor, object]:
        with self._recording():
            out = self.policy(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **self.keep_last,
                **image_kwargs(images, ids.device),
            )
        return out.logits[:, -1], getattr(out, self.cache_kw)  # (n, V), the KV cache

    def step(self, token: Tensor, attention: Tensor, position: Tensor, cache) -> Tensor:
        with self._recording():
            out = self.policy(
                input_ids=token[:, None],
                attention_mask=attention,
                position_ids=position,
                use_cache=True,
                **{self.cache_kw: cache},
            )
        return out.logits[:, -1]  # (b, V)

    def _recording(self):
        return self.routes.recording() if self.routes is not None else nullcontext()

    def any_rank_running(self, running: bool) -> bool:
        if not self.synced:
            return running
        import torch.distributed as dist

        flag = torch.tensor(float(running), device=next(self.policy.parameters()).device)
        dist.all_reduce(flag)
        return bool(flag > 0)


def _sharded(policy: nn.Module) -> bool:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return False
    from transformers.integrations import is_deepspeed_zero3_enabled
    from transformers.integrations.fsdp import is_fsdp_managed_module

    return is_fsdp_managed_module(policy) or is_deepspeed_zero3_enabled()


def _pad_routes(routes: Tensor, width: int) -> Tensor:
    """Routes right-padded with -1 (unknown) to ``width`` tokens. Shape: (b, R, L, K) -> (b, width, L, K)."""
    return nn.functional.pad(routes, (0, 0, 0, 0, 0, width - routes.shape[1]), value=-1)


def _append_to_groups(rows: Tensor, extra: Tensor, g: int, value) -> Tensor:
    """One ``extra`` row after each group of ``g`` rows. Shapes: (P_n * G, R1, ...), (P_n, R2, ...) ->
    (P_n * (G + 1), max(R1, R2), ...)."""
    width = max(rows.shape[1], extra.shape[1])
    tail = rows.shape[2:]

    def pad(x: Tensor) -> Tensor:
        return nn.functional.pad(x, (0, 0) * len(tail) + (0, width - x.shape[1]), value=value)

    rows = pad(rows).reshape(extra.shape[0], g, width, *tail)  # (P_n, G, W, ...)
    return torch.cat([rows, pad(extra)[:, None]], dim=1).reshape(-1, width, *tail)
