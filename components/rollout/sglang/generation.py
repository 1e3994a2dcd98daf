"""SGLang's ``POST /generate``: one request per prompt, its answers as the server layer's `Answer`.

Request: ``{"input_ids": [...], "sampling_params": {...}, "return_logprob": true}`` with the unpadded
prompt, and for a prompt with images ``"image_data"``: each image as a base64 PNG data URL, as SGLang's native API takes
them (``GenerateReqInput.image_data`` in ``sglang/srt/managers/io_struct.py``, read in SGLang 0.5.23). A single request
(``n`` = 1) takes the list of its images; with ``n`` > 1 SGLang turns the request into a batch of one
(``_handle_parallel_sampling``) whose ``image_data`` is one list per prompt (``_normalize_image_data``), so the list is
wrapped once more. The server's own processor expands the image placeholders of ``input_ids`` again (its Qwen2-VL
processor matches ``<|vision_start|>(<|image_pad|>)+<|vision_end|>``), which gives the same ids when its processor is
the policy's. ``max_new_tokens`` is always explicit (SGLang's default is 128) and ``top_k=0`` is sent as SGLang's
``-1`` (``SamplingParams.verify`` rejects 0). With ``n > 1`` SGLang expands the request prompt-major
(``_expand_parallel_sample_requests``: n copies per prompt) and answers a list of n items; each item has
``output_ids`` and ``meta_info`` with ``finish_reason`` = ``{"type": "stop" | "length" | "abort", ...}``,
``output_token_logprobs`` = ``[[logprob, token_id, text], ...]`` and ``weight_version``. The log-probs are
log_softmax(logits / T) of the sampled token; below temperature 1e-6 SGLang samples greedily (top_k = 1, temperature
1), so greedy log-probs are untempered, as in `HFRollout`.

Routes (a mixture-of-experts policy, server flag ``--enable-return-routed-experts``): ``return_routed_experts: true``
and ``routed_experts_start_len: s`` ask for the experts each layer chose for the tokens fed from position s on, which
SGLang answers as ``meta_info.routed_experts``: base64 of the raw int32 bytes (no header) of a (P + n - 1 - s, L, K)
array, P + n the input and output tokens (the last output token is never fed) (``GenerateReqInput`` in
``managers/io_struct.py``, ``_maybe_collect_routed_experts`` in ``managers/scheduler_components/batch_result_processor.py``
and ``_b64_encode_per_request`` in ``managers/detokenizer_manager.py``, SGLang 0.5.23).

A weight update sent with ``abort_all_requests`` ends the requests in flight with finish ``abort`` and the tokens
sampled so far (the server layer continues them: partial rollouts).
"""

from __future__ import annotations

import base64

import numpy as np

from ..server.samples import Answer, Request, Sample, Scored, image_data, to_batch
from .client import Retry, SGLangClient, SGLangError

__all__ = ["Sample", "image_data", "request", "sampling_params", "to_batch"]


def sampling_params(
    n: int, temperature: float, top_p: float, top_k: int, max_new_tokens: int, stop_token_ids: list[int]
) -> dict:
    return {
        "n": n,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k or -1,  # SGLang: -1 = whole vocabulary, 0 is rejected
        "max_new_tokens": max_new_tokens,
        "stop_token_ids": stop_token_ids,
    }


def request(client: SGLangClient, url: str, req: Request, lora_name: str | None, keep_aborted: bool) -> list[Answer]:
    """The ``req.n`` answers of one ``/generate`` request (an aborted one is sent again unless ``keep_aborted``)."""
    n = req.n
    params = sampling_params(n, req.temperature, req.top_p, req.top_k, req.max_new_tokens, req.stop_token_ids)
    if req.ignore_eos:
        params["ignore_eos"] = True

    def check(answer) -> None:
        items = answer if isinstance(answer, list) else [answer]
        if len(items) != n or not all(isinstance(it, dict) and "meta_info" in it for it in items):
            raise SGLangError(
                f"SGLang server at {url}: /generate returned {len(items)} item(s) for n={n}: {str(answer)[:300]}"
            )
        aborted = [r for r in (it["meta_info"].get("finish_reason") or {} for it in items) if r.get("type") == "abort"]
        if aborted and not keep_aborted:
            raise Retry(f"request aborted by the server ({aborted[0].get('message')})")

    body = {"input_ids": req.input_ids, "sampling_params": params, "return_logprob": True}
    if req.images:
        body["image_data"] = [req.images] if n > 1 else req.images
    if lora_name is not None:  # sample with this loaded adapter (its name carries the version)
        body["lora_path"] = lora_name
    if req.routes_from is not None:
        body.update(return_routed_experts=True, routed_experts_start_len=req.routes_from)
    answer = client.request(url, "/generate", body, check=check)
    return [_parse(url, item, req) for item in (answer if isinstance(answer, list) else [answer])]


def routes(url: str, encoded: str | None, rows: int) -> np.ndarray:
    """``meta_info.routed_experts`` (base64 of raw int32 bytes) as (rows, L * K)."""
    if encoded is None:
        raise SGLangError(
            f"SGLang server at {url} answered no meta_info.routed_experts: start it with --enable-return-routed-experts, "
            "or set return_routes: false"
        )
    flat = np.frombuffer(base64.b64decode(encoded), dtype=np.int32)
    if rows <= 0 or flat.size % rows:
        raise SGLangError(f"SGLang server at {url}: {flat.size} routed experts do not split into {rows} tokens")
    return flat.reshape(rows, -1)


def _parse(url: str, item: dict, req: Request | None = None) -> Answer:
    ids, meta = [int(t) for t in item["output_ids"]], item["meta_info"]
    logprobs = meta.get("output_token_logprobs") or []
    if len(logprobs) != len(ids) or any(int(lp[1]) != t for lp, t in zip(logprobs, ids)):
        raise SGLangError(
            f"SGLang server at {url}: output_token_logprobs do not match output_ids ({len(logprobs)} vs {len(ids)} tokens)"
        )
    if any(lp[0] is None for lp in logprobs):  # JSON null: a non-finite log-prob on the server
        raise SGLangError(f"SGLang server at {url} returned a null (non-finite) log-prob for a sampled token")
    served = meta.get("weight_version")
    routed = None
    if req is not None and req.routes_from is not None and ids:
        routed = routes(url, meta.get("routed_experts"), len(req.input_ids) + len(ids) - 1 - req.routes_from)
    return Answer(
        ids,
        [float(lp[0]) for lp in logprobs],
        (meta.get("finish_reason") or {}).get("type", "stop"),
        None if served is None else str(served),
        routes=routed,
    )


def score(
    client: SGLangClient,
    url: str,
    prompt: list[int],
    continuation: list[int],
    images,
    lora_name: str | None,
    top_k: int = 0,
) -> Scored:
    """The server's log p(y_t | x, y_<t) of a given continuation, its top k at each position and its weight version.

    ``max_new_tokens: 0`` runs the prefill alone; ``logprob_start_len: P - 1`` (P: the prompt's length) asks for the
    input log-probs from the prompt's last token on, which SGLang answers as ``meta_info.input_token_logprobs`` =
    ``[[None, id_{P-1}, None], [logprob, id_P, None], ...]`` (entry j: token P - 1 + j given those before it; the first
    has none) and, with ``top_logprobs_num: k``, ``input_top_logprobs`` = ``[None, [[logprob, id, None] x k], ...]``,
    most likely first (``logits_processor`` and ``scheduler_components/logprob_result_processor.py``, SGLang 0.5.23).
    Input log-probs are log_softmax of the raw logits: SGLang applies no sampling temperature to them."""
    start = len(prompt) - 1  # the prompt's cache stays usable: only its last position is scored again
    body = {
        "input_ids": prompt + continuation,
        "sampling_params": {"n": 1, "max_new_tokens": 0, "temperature": 1.0},
        "return_logprob": True,
        "logprob_start_len": start,
    }
    if top_k:
        body["top_logprobs_num"] = top_k
    if images:
        body["image_data"] = images
    if lora_name is not None:
        body["lora_path"] = lora_name
    answer = client.request(url, "/generate", body)
    item = (answer[0] if isinstance(answer, list) else answer) or {}
    meta = item.get("meta_info") or {}
    scored = meta.get("input_token_logprobs") or []
    if len(scored) != len(continuation) + 1 or [int(e[1]) for e in scored[1:]] != list(continuation):
        raise SGLangError(
            f"SGLang server at {url}: /generate scored {len(scored) - 1} input tokens after the prompt for "
            f"{len(continuation)} given ones (or other ids): {str(scored)[:200]}"
        )
    if any(entry[0] is None for entry in scored[1:]):  # JSON null: a non-finite log-prob on the server
        raise SGLangError(f"SGLang server at {url} returned a null (non-finite) log-prob for a given token")
    served = meta.get("weight_version")
    version = None if served is None else str(served)
    logprobs = [float(entry[0]) for entry in scored[1:]]
    if not top_k:
        return Scored(logprobs, version)
    tops = (meta.get("input_top_logprobs") or [])[1:]
    if len(tops) != len(continuation) or any(not top or len(top) < top_k for top in tops):
        raise SGLangError(
            f"SGLang server at {url}: /generate answered no top {top_k} log-probs for some of the "
            f"{len(continuation)} given tokens (input_top_logprobs: {str(meta.get('input_top_logprobs'))[:200]})"
        )
    nan = float("nan")  # JSON null: a non-finite log-prob, which the teacher's check names (components.teacher.answers)
    ranked = [sorted(top, key=lambda e: -(nan if e[0] is None else float(e[0])))[:top_k] for top in tops]
    return Scored(
        logprobs,
        version,
        [[int(e[1]) for e in top] for top in ranked],
        [[nan if e[0] is None else float(e[0]) for e in top] for top in ranked],
    )
