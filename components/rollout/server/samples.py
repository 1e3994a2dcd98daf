"""What one generation request asks of an engine (`Request`), what it answers (`Answer`), a given continuation scored
(`Scored`), and the answers of a rollout turned into a `RolloutBatch` (`to_batch`).

Every engine is sent the unpadded prompt ids (never re-tokenised text) with an explicit ``max_new_tokens``, and
answers each sample's token ids with the log-prob of every sampled token under the weights that sampled it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from lightning_rl.core.batch import Prompts, RolloutBatch

from ..base import response_mask_from_eos


@dataclass(frozen=True)
class Request:
    """One prompt's ``n`` samples. ``temperature`` 0 is greedy (untempered log-probs); ``top_k`` 0 is off."""

    input_ids: list[int]
    n: int
    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop_token_ids: list[int] = field(default_factory=list)
    images: list[str] | None = None  # the prompt's images as `image_data` entries (base64 PNG data URLs)
    ignore_eos: bool = False
    routes_from: int | None = None  # ask for the routes of the tokens from this position of input_ids on (None: none)


class Answer(NamedTuple):
    """One sample as the server answered it."""

    ids: list[int]
    logprobs: list[float]
    finish: str  # stop | length | abort (interrupted by a weight push: the tokens so far)
    weight_version: str | None  # the server's weight version, when its answers carry one
    support: list[list[int]] | None = None  # per token: the ids the sampler kept (vLLM's sampling_mask), if reported
    routes: np.ndarray | None = None  # (T, L * K) int: the experts chosen for each token fed, from routes_from on


class Scored(NamedTuple):
    """A given continuation as a server scored it: raw log-probs (log_softmax of the logits, no temperature)."""

    logprobs: list[float]  # log p(y_t | x, y_<t) of each continuation token
    weight_version: str | None  # the server's weight version, when its answers carry one
    top_ids: list[list[int]] | None = None  # per continuation position, the k most likely tokens, most likely first
    top_logprobs: list[list[float]] | None = None  # their log-probs


class Sample(NamedTuple):
    ids: list[int]
    logprobs: list[float]
    finish: str  # stop | length (| abort, before a partial response is continued)
    versions: list[int]  # per token: the weight version that sampled it
    support: list[list[int]] | None = None  # per token: the ids the sampler kept, if reported
    routes: np.ndarray | None = None  # (prompt + len(ids) - 1, L * K): every token fed (None: unknown)


def image_data(images: list) -> list[str]:
    """A prompt's images as base64 PNG data URLs (lossless: the server decodes the pixels the trainer read)."""
    import base64
    import io

    urls = []
    for image in images:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        urls.append("data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode())
    return urls


def to_batch(
    prompts: Prompts,
    samples: list[Sample],
    rows: int,
    greedy_last: bool,
    eos_ids: list[int],
    pad_token_id: int,
    version: int,
    top_k: int | None = None,
) -> RolloutBatch:
    """Prompt-major ``samples`` (``rows`` per prompt; the last one greedy when ``greedy_last``) -> a batch of B = P_n * rows.

    ``response_mask`` covers what the server sampled, up to and including the first EOS. ``truncated``
    = finish ``length`` and no EOS: an engine may check the length cap before the stop tokens (SGLang does), so an
    EOS sampled exactly at ``max_new_tokens`` can come back as ``length``, yet that response is complete.
    With ``top_k`` (a mixture of experts' k) and every sample's routes: ``prompt_routed_experts`` and
    ``routed_experts`` (lightning_rl.core.batch.ROUTES); a sample without them drops the batch's (never misaligned).
    """
    b, n_prompts = len(samples), len(prompts)
    width = max(1, max(len(s.ids) for s in samples))
    response_ids = torch.full((b, width), pad_token_id, dtype=torch.long)
    logprobs = torch.zeros(b, width)
    token_versions = torch.full((b, width), version, dtype=torch.long)  # padding: the request's version
    for i, s in enumerate(samples):
        response_ids[i, : len(s.ids)] = torch.tensor(s.ids, dtype=torch.long)
        logprobs[i, : len(s.ids)] = torch.tensor(s.logprobs)
        token_versions[i, : len(s.ids)] = torch.tensor(s.versions, dtype=torch.long)
    lengths = torch.tensor([len(s.ids) for s in samples])
    eos_mask, no_eos = response_mask_from_eos(response_ids, eos_ids)
    response_mask = eos_mask * (torch.arange(width)[None, :] < lengths[:, None]).long()  # (B, R)
    truncated = torch.tensor([s.finish == "length" for s in samples]) & no_eos  # (B,)
    is_greedy = (torch.arange(rows) == rows - 1).repeat(n_prompts) if greedy_last else None  # (B,)
    support = _support(samples, width)
    device = prompts.prompt_ids.device
    routes = None
    if top_k is not None and samples and all(s.routes is not None for s in samples):
        routes = _routes(prompts.prompt_mask.sum(-1).repeat_interleave(rows).tolist(), samples, width, top_k)
    return RolloutBatch(
        **prompts.per_row(rows),
        response_ids=response_ids.to(device),
        response_mask=response_mask.to(device),
        rollout_logprobs=(logprobs * response_mask).to(device),
        truncated=truncated.to(device),
        group_ids=torch.arange(n_prompts, device=device).repeat_interleave(rows),
        is_greedy=None if is_greedy is None else is_greedy.to(device),
        sample_mask=None if is_greedy is None else (is_greedy == 0).float().to(device),
        versions=torch.tensor([min(s.versions, default=version) for s in samples], dtype=torch.long, device=device),
        token_versions=token_versions.to(device),
        sampling_support=None if support is None else support.to(device),
        prompt_routed_experts=None if routes is None else routes[0].to(device),
        routed_experts=None if routes is None else routes[1].to(device),
    )


def _support(samples: list[Sample], width: int) -> torch.Tensor | None:
    """The kept sets the server reported, as a (B, R, K) long tensor, -1 padded (a sample or token without one lists
    none); None when no sample reports one."""
    if all(s.support is None for s in samples):
        return None
    k = max((len(kept) for s in samples for kept in s.support or ()), default=1)
    support = torch.full((len(samples), width, max(k, 1)), -1, dtype=torch.long)
    for i, s in enumerate(samples):
        for t, kept in enumerate(s.support or ()):
            support[i, t, : len(kept)] = torch.tensor(kept, dtype=torch.long)
    return support


def _routes(prompt_lengths: list[int], samples: list[Sample], width: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's routes (its prompt's p tokens, then its response's but the last) laid out as the batch: the
    prompt's left-padded (B, P, L, K), the response's (B, R, L, K), -1 where unknown."""
    p_width = max(prompt_lengths)
    layers = samples[0].routes.shape[1] // k
    prompt = torch.full((len(samples), p_width, layers, k), -1, dtype=torch.long)
    response = torch.full((len(samples), width, layers, k), -1, dtype=torch.long)
    for i, (p, s) in enumerate(zip(prompt_lengths, samples)):
        if s.routes.shape != (p + len(s.ids) - 1, layers * k):
            raise ValueError(
                f"sample {i}: the server's routes cover {s.routes.shape[0]} tokens of {layers * k} experts, not the "
                f"{p + len(s.ids) - 1} tokens it was fed ({p} prompt + {len(s.ids)} sampled - 1) of {layers} layers x {k}"
            )
        routed = torch.from_numpy(np.asarray(s.routes, dtype=np.int64)).reshape(-1, layers, k)
        prompt[i, p_width - p :] = routed[:p]
        response[i, : len(s.ids) - 1] = routed[p:]
    return prompt, response
