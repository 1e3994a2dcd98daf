"""One ``POST /generate`` per prompt and the answers turned into a `RolloutBatch`.

Request: ``{"input_ids": [...], "sampling_params": {...}, "return_logprob": true}`` with the unpadded
prompt (never re-tokenised text), and for a prompt with images ``"image_data"``: each image as a base64 PNG data URL,
as SGLang's native API takes them (``GenerateReqInput.image_data`` in ``sglang/srt/managers/io_struct.py``, read in
SGLang 0.5.23). A single request (``n`` = 1) takes the list of its images; with ``n`` > 1 SGLang turns the request into
a batch of one (``_handle_parallel_sampling``) whose ``image_data`` is one list per prompt (``_normalize_image_data``),
so the list is wrapped once more. The server's own processor expands the image placeholders of ``input_ids`` again
(its Qwen2-VL processor matches ``<|vision_start|>(<|image_pad|>)+<|vision_end|>``), which gives the same ids when its
processor is the policy's. ``max_new_tokens`` is always explicit (SGLang's default is 128) and
``top_k=0`` is sent as SGLang's ``-1`` (``SamplingParams.verify`` rejects 0). With ``n > 1`` SGLang
expands the request prompt-major (``_expand_parallel_sample_requests``: n copies per prompt) and answers
a list of n items; each item has ``output_ids`` and ``meta_info`` with ``finish_reason`` =
``{"type": "stop" | "length" | "abort", ...}``, ``output_token_logprobs`` = ``[[logprob, token_id,
text], ...]`` and ``weight_version``. The log-probs are log_softmax(logits / T) of the sampled token;
below temperature 1e-6 SGLang samples greedily (top_k = 1, temperature 1), so greedy log-probs are
untempered, as in `HFRollout`.

Partial rollouts (``partial=True``): a weight update sent with ``abort_all_requests`` ends the requests in
flight with finish ``abort`` and the tokens sampled so far. Each such response is continued with the new
weights (``input_ids`` = prompt + the tokens so far, the remaining ``max_new_tokens``), and every token keeps
the version that sampled it, with its log-prob under that version.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from lightning_rl.core.batch import Prompts, RolloutBatch

from ..base import response_mask_from_eos
from .client import Retry, SGLangClient, SGLangError


class Sample(NamedTuple):
    ids: list[int]
    logprobs: list[float]
    finish: str  # stop | length (| abort, before a partial response is continued)
    versions: list[int]  # per token: the weight version that sampled it


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


def image_data(images: list) -> list[str]:
    """A prompt's images as SGLang's ``image_data`` entries: base64 PNG data URLs (lossless: the server decodes the pixels the trainer read)."""
    import base64
    import io

    urls = []
    for image in images:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        urls.append("data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode())
    return urls


def generate(
    client: SGLangClient,
    url: str,
    input_ids: list[int],
    params: dict,
    version: int,
    lora_name: str | None = None,
    partial: bool = False,
    check_version: bool = True,
    images: list[str] | None = None,
) -> list[Sample]:
    """The ``params["n"]`` samples of one prompt; aborted requests are sent again (they count as retries), or with
    ``partial`` continued from where they stopped.

    ``version``: the trainer's weight version when the request is sent. With ``check_version`` every answer must
    come from that version or a later one (a server that missed an update fails loudly); a server that reports no
    number (an adapter load does not change it) is taken to hold ``version``.
    ``lora_name``: the LoRA adapter to sample with (a server that does not hold it refuses the request).
    ``images``: the prompt's images (`image_data`), None for a text prompt.
    """
    items = _request(client, url, input_ids, params, lora_name, partial, images)
    samples = [_parse(url, item, version, check_version) for item in items]
    if partial:
        samples = [_continue(client, url, input_ids, params, s, lora_name, check_version, images) for s in samples]
    return samples


def _request(
    client: SGLangClient,
    url: str,
    input_ids: list[int],
    params: dict,
    lora_name: str | None,
    partial: bool,
    images: list[str] | None = None,
) -> list[dict]:
    n = params["n"]

    def check(answer) -> None:
        items = answer if isinstance(answer, list) else [answer]
        if len(items) != n or not all(isinstance(it, dict) and "meta_info" in it for it in items):
            raise SGLangError(
                f"SGLang server at {url}: /generate returned {len(items)} item(s) for n={n}: {str(answer)[:300]}"
            )
        aborted = [r for r in (it["meta_info"].get("finish_reason") or {} for it in items) if r.get("type") == "abort"]
        if aborted and not partial:
            raise Retry(f"request aborted by the server ({aborted[0].get('message')})")

    body = {"input_ids": input_ids, "sampling_params": params, "return_logprob": True}
    if images:
        body["image_data"] = [images] if n > 1 else images
    if lora_name is not None:  # sample with this loaded adapter (its name carries the version)
        body["lora_path"] = lora_name
    with client.gate.sampling():  # never while a push of several requests is half done
        answer = client.request(url, "/generate", body, check=check)
    return answer if isinstance(answer, list) else [answer]


def _continue(
    client: SGLangClient,
    url: str,
    input_ids: list[int],
    params: dict,
    sample: Sample,
    lora_name: str | None,
    check_version: bool,
    images: list[str] | None = None,
) -> Sample:
    """A response interrupted by a weight update, finished with the weights now served."""
    stalls = 0
    while sample.finish == "abort":
        remaining = params["max_new_tokens"] - len(sample.ids)
        if remaining <= 0:
            return sample._replace(finish="length")
        more = dict(params, n=1, max_new_tokens=remaining)
        (item,) = _request(client, url, input_ids + sample.ids, more, lora_name, partial=True, images=images)
        part = _parse(url, item, max(sample.versions, default=0), check_version)
        stalls = 0 if part.ids else stalls + 1
        if stalls > client.max_retries:
            raise SGLangError(
                f"SGLang server at {url}: a partial response was aborted {stalls} times in a row without a new token"
            )
        sample = Sample(
            sample.ids + part.ids, sample.logprobs + part.logprobs, part.finish, sample.versions + part.versions
        )
    return sample


def _parse(url: str, item: dict, version: int, check_version: bool) -> Sample:
    ids, meta = [int(t) for t in item["output_ids"]], item["meta_info"]
    logprobs = meta.get("output_token_logprobs") or []
    if len(logprobs) != len(ids) or any(int(lp[1]) != t for lp, t in zip(logprobs, ids)):
        raise SGLangError(
            f"SGLang server at {url}: output_token_logprobs do not match output_ids ({len(logprobs)} vs {len(ids)} tokens)"
        )
    if any(lp[0] is None for lp in logprobs):  # JSON null: a non-finite log-prob on the server
        raise SGLangError(f"SGLang server at {url} returned a null (non-finite) log-prob for a sampled token")
    served = meta.get("weight_version")
    number = (
        None if served is None else int(served) if str(served).isdigit() else 0
    )  # 0: a server still on its launch weights ("default")
    if check_version and version and number is not None and number < version:
        raise SGLangError(
            f"SGLang server at {url} sampled with weight_version {served!r} but the trainer pushed {version}: "
            "it missed a weight update (restarted, or not listed in weight_update_urls)"
        )
    stamp = number if number is not None and check_version else version
    return Sample(
        ids,
        [float(lp[0]) for lp in logprobs],
        (meta.get("finish_reason") or {}).get("type", "stop"),
        [stamp] * len(ids),
    )


def to_batch(
    prompts: Prompts,
    samples: list[Sample],
    rows: int,
    greedy_last: bool,
    eos_ids: list[int],
    pad_token_id: int,
    version: int,
) -> RolloutBatch:
    """Prompt-major ``samples`` (``rows`` per prompt; the last one greedy when ``greedy_last``) -> a batch of B = P_n * rows.

    ``response_mask`` covers what the server sampled, up to and including the first EOS. ``truncated``
    = ``finish_reason`` length and no EOS: SGLang checks the length cap before the stop tokens, so an
    EOS sampled exactly at ``max_new_tokens`` comes back as ``length``, yet that response is complete.
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
    device = prompts.prompt_ids.device
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
    )
