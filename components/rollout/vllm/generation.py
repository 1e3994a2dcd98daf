"""vLLM's token-in token-out ``POST /inference/v1/generate`` (``--enable-scale-out``; vLLM 0.32,
``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``): one request per prompt, its answers as the server
layer's `Answer`.

Request: ``{"token_ids": [...], "sampling_params": {n, temperature, top_p, top_k, max_tokens, stop_token_ids,
ignore_eos, logprobs: 0}, "model": <adapter>}`` (``model`` only to sample with a LoRA adapter). ``max_tokens`` is
always explicit (left out, vLLM fills the context). Answer: ``choices`` (``index`` 0..n-1), each with ``token_ids``
(a stop token or EOS that ended it included), ``logprobs.content[i].logprob`` (the sampled token's: with
``--logprobs-mode processed_logprobs`` log_softmax(logits / T); greedy: untempered), ``finish_reason`` stop | length
| abort and ``weight_versions``: ``[{version, start, end}]`` spans of output tokens and the weights that sampled them.
A non-finite log-prob comes as -9999.0. A server started with ``--return-sampling-mask`` (Model Runner V2 only:
Triton, so not the CPU build) adds ``sampling_mask``: per output token, the ids top-k / top-p / min-p left samplable
(vLLM's ``SamplingMask.token_ids``); the trainer then renormalises its log-probs over exactly those. ``/pause?mode=abort`` ends the requests in flight with finish ``abort``, the
tokens so far and their log-probs (the server layer continues them: partial rollouts).

Routes (a mixture-of-experts policy, server flag ``--enable-return-routed-experts``; the CPU build refuses it: it
needs Model Runner V2, which needs Triton): each choice's ``routed_experts`` is base64 of ``.npy`` bytes of a
(P + n - 1 - s, L, K) array (uint8, uint16 or int32), the experts each layer chose for the tokens fed from position s
(``routed_experts_prompt_start``) on; the last sampled token is never fed (``GenerateChoiceBase`` in
``entrypoints/scale_out/token_in_token_out/protocol.py``, ``numpy2base64`` in ``utils/serial_utils.py``, vLLM 0.32).

Scoring given tokens: ``sampling_params: {prompt_logprobs: k, max_tokens: 1}`` answers ``prompt_logprobs``: entry i
is ``{"<token id>": {"logprob": ..., "rank": ...}}``, the log-prob of prompt token i given those before it and of the
k most likely tokens there (entry 0 is null); prompt log-probs are raw (untempered) in every mode.
"""

from __future__ import annotations

import base64
import io

import numpy as np

from ..server.http import Retry
from ..server.samples import Answer, Request, Scored
from .client import VLLMClient, VLLMError

NON_FINITE = -9999.0  # vLLM's stand-in for a -inf or NaN log-prob


def sampling_params(request: Request) -> dict:
    params = {
        "n": request.n,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,  # 0: off
        "max_tokens": request.max_new_tokens,
        "stop_token_ids": list(request.stop_token_ids),
        "logprobs": 0,  # the sampled token's only
    }
    if request.ignore_eos:
        params["ignore_eos"] = True
    if request.routes_from:
        params["routed_experts_prompt_start"] = request.routes_from
    return params


def generate(client: VLLMClient, url: str, request: Request, adapter: str | None, keep_aborted: bool) -> list[Answer]:
    """The ``request.n`` answers of one request (an aborted one is sent again unless ``keep_aborted``)."""
    if request.images:
        raise VLLMError(
            f"vLLM server at {url}: prompts with images are not sent to vLLM by this rollout yet (its token-in "
            "endpoint takes images as preprocessed features); sample vision-language prompts with SGLangRollout"
        )
    n = request.n

    def check(answer) -> None:
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or len(choices) != n:
            raise VLLMError(
                f"vLLM server at {url}: /inference/v1/generate returned {len(choices or [])} choice(s) for n={n}: "
                f"{str(answer)[:300]}"
            )
        if not keep_aborted and any(c.get("finish_reason") == "abort" for c in choices):
            raise Retry("request aborted by the server")

    body = {"token_ids": request.input_ids, "sampling_params": sampling_params(request)}
    if adapter is not None:
        body["model"] = adapter
    answer = client.request(url, "/inference/v1/generate", body, check=check)
    return [_parse(url, choice, request) for choice in sorted(answer["choices"], key=lambda c: c["index"])]


def routes(url: str, encoded: str | None, rows: int) -> np.ndarray:
    """A choice's ``routed_experts`` (base64 of ``.npy`` bytes, (rows, L, K)) as (rows, L * K)."""
    if encoded is None:
        raise VLLMError(
            f"vLLM server at {url} answered no routed_experts: start it with --enable-return-routed-experts, or set "
            "return_routes: false"
        )
    array = np.load(io.BytesIO(base64.b64decode(encoded)), allow_pickle=False)
    if array.ndim != 3 or array.shape[0] != rows:
        raise VLLMError(
            f"vLLM server at {url}: routed_experts of shape {array.shape}, expected ({rows}, layers, top_k)"
        )
    return array.astype(np.int64).reshape(rows, -1)


def _parse(url: str, choice: dict, request: Request | None = None) -> Answer:
    ids = [int(t) for t in choice.get("token_ids") or []]
    content = (choice.get("logprobs") or {}).get("content") or []
    if len(content) != len(ids) or any(int(c["token_id"]) != t for c, t in zip(content, ids)):
        raise VLLMError(
            f"vLLM server at {url}: the log-probs do not match the token ids ({len(content)} vs {len(ids)})"
        )
    logprobs = [float(c["logprob"]) for c in content]
    if any(lp <= NON_FINITE for lp in logprobs):
        raise VLLMError(f"vLLM server at {url} returned a non-finite log-prob for a sampled token")
    spans = choice.get("weight_versions") or []
    # the oldest weights that sampled a token of it (an answer spans several versions only when paused in mode keep)
    version = str(spans[0]["version"]) if spans else None
    routed = None
    if request is not None and request.routes_from is not None and ids:
        routed = routes(url, choice.get("routed_experts"), len(request.input_ids) + len(ids) - 1 - request.routes_from)
    return Answer(ids, logprobs, choice.get("finish_reason") or "stop", version, _support(url, choice, ids), routed)


def _support(url: str, choice: dict, ids: list[int]) -> list[list[int]] | None:
    """``sampling_mask``: each output token's kept ids (None when the server reports none)."""
    mask = choice.get("sampling_mask")
    if mask is None:
        return None
    support = [[int(t) for t in kept] for kept in mask]
    if len(support) != len(ids) or any(t not in kept for t, kept in zip(ids, support)):
        raise VLLMError(
            f"vLLM server at {url}: sampling_mask lists {len(support)} kept sets for {len(ids)} tokens, or a sampled "
            "token outside its own"
        )
    return support


def score(
    client: VLLMClient, url: str, prompt: list[int], continuation: list[int], adapter: str | None, top_k: int = 0
) -> Scored:
    """The server's log p(y_t | x, y_<t) of a given continuation (raw: vLLM's prompt log-probs take no temperature),
    with ``top_k`` its k most likely tokens at each position, and its weight version.

    ``prompt_logprobs: k`` gives each prompt position the given token and the k most likely (k + 1 entries when the
    given one is not among them); vLLM's ``--max-logprobs`` (20 by default) caps k."""
    body = {"token_ids": prompt + continuation, "sampling_params": {"prompt_logprobs": top_k, "max_tokens": 1,
            "temperature": 0.0, "logprobs": 0}}  # fmt: skip
    if adapter is not None:
        body["model"] = adapter
    answer = client.request(url, "/inference/v1/generate", body)
    scored = (answer or {}).get("prompt_logprobs") or []
    tokens = prompt + continuation
    if len(scored) != len(tokens) or any(
        str(t) not in (scored[i] or {}) for i, t in enumerate(continuation, len(prompt))
    ):
        raise VLLMError(
            f"vLLM server at {url}: /inference/v1/generate came back with {len(scored)} prompt log-probs for "
            f"{len(tokens)} tokens (or without the given ones)"
        )
    entries = scored[len(prompt) :]
    logprobs = [float(entry[str(t)]["logprob"]) for entry, t in zip(entries, continuation)]
    if any(lp <= NON_FINITE for lp in logprobs):
        raise VLLMError(f"vLLM server at {url} returned a non-finite log-prob for a given token")
    spans = (answer.get("choices") or [{}])[0].get("weight_versions") or []
    version = str(spans[0]["version"]) if spans else None
    if not top_k:
        return Scored(logprobs, version)
    ranked = [sorted(entry.items(), key=lambda kv: -float(kv[1]["logprob"]))[:top_k] for entry in entries]
    return Scored(
        logprobs,
        version,
        [[int(i) for i, _ in top] for top in ranked],
        [[float(v["logprob"]) for _, v in top] for top in ranked],
    )
