"""OpenAI's request and response shapes for the endpoint: what a call asks for, and the JSON it is answered with.

Chat: https://platform.openai.com/docs/api-reference/chat/create (``choices[0].message`` with ``content`` and
``tool_calls``, ``finish_reason`` stop / length / tool_calls, ``logprobs.content[i]`` {token, logprob, bytes,
top_logprobs}, ``usage``). Completions: https://platform.openai.com/docs/api-reference/completions/create
(``choices[0].text``, ``logprobs`` {tokens, token_logprobs, text_offset, top_logprobs}). Both answers add the
exact ids, as vLLM and SGLang do: ``prompt_token_ids`` and ``choices[0].token_ids``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from .tool_calls import ToolCallParser


class BadRequest(ValueError):
    """A request the endpoint cannot serve; answered 400 with this message."""


@dataclass(frozen=True)
class CallLimits:
    """What one request asks of the sampler beyond the configured settings."""

    max_tokens: int | None
    stop_token_ids: tuple[int, ...]
    logprobs: bool


SAMPLER_SETTINGS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
)
"""Sampling settings a request may carry: the endpoint samples with model.rollout's (the trainer's log-probs mirror
them), so it warns once that the request's are not used."""
NO_EFFECT = (
    "model",
    "messages",
    "prompt",
    "tools",
    "n",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "logprobs",
    "top_logprobs",
    "tool_choice",
    "response_format",
    "parallel_tool_calls",
    "echo",
    "best_of",
    "logit_bias",
    # bookkeeping that does not change the answer
    "user",
    "metadata",
    "store",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
)
"""Every key the endpoint reads or may accept; any other is refused (it would otherwise be silently ignored)."""


def call_limits(request: dict, route: str, model_name: str, tokenizer, warn) -> CallLimits:
    """The request's length cap, stop tokens and logprobs flag; refuses (`BadRequest`) what cannot be honoured exactly:
    another model, ``n`` > 1, streaming, ``top_logprobs``, a forced or disabled tool choice, a structured response
    format, a logit bias, ``echo``, ``best_of``, ``parallel_tool_calls: false`` and any parameter it does not know.
    ``warn(text)`` reports a sampling setting the endpoint does not follow (once per run)."""
    unknown = sorted(set(request) - set(NO_EFFECT) - set(SAMPLER_SETTINGS))
    if unknown:
        raise BadRequest(
            f"unsupported parameter(s) {unknown}: the trainer's endpoint does not honour them (remove them from the request)"
        )
    if request.get("model") not in (None, model_name):
        raise BadRequest(
            f"model {request['model']!r} is not served here: this endpoint serves {model_name!r} "
            "(model.agent.init_args.model_name)"
        )
    if request.get("stream"):
        raise BadRequest("stream: true is not supported by the trainer's endpoint; request the whole answer")
    if int(request.get("n") or 1) != 1 or int(request.get("best_of") or 1) != 1:
        raise BadRequest(
            "n must be 1 (and best_of 1): each call is one turn of the episode (run the agent several times for several samples)"
        )
    if request.get("top_logprobs") or (route == "completions" and int(request.get("logprobs") or 0) > 1):
        raise BadRequest(
            "top_logprobs is not supported: the sampler reports the log-prob of the sampled token only (logprobs: true)"
        )
    if request.get("tool_choice") not in (None, "auto"):
        raise BadRequest(
            f"tool_choice {request['tool_choice']!r} is not supported: the model decides whether to call a tool (auto)"
        )
    if request.get("parallel_tool_calls") is False:
        raise BadRequest("parallel_tool_calls: false is not supported: every call the model writes is answered")
    if (request.get("response_format") or {"type": "text"}) != {"type": "text"}:
        raise BadRequest("response_format other than text is not supported: the sampler does not constrain the output")
    if request.get("logit_bias"):
        raise BadRequest("logit_bias is not supported: the sampler's logits are the trainer's")
    if request.get("echo"):
        raise BadRequest("echo is not supported: the answer's prompt_token_ids hold the prompt")
    for key in SAMPLER_SETTINGS:
        if request.get(key) is not None:
            warn(
                f"the agent's requests set {key!r}; the endpoint samples with model.rollout's settings (the trainer's "
                "log-probs mirror them), so it is not used"
            )
    cap = request.get("max_completion_tokens") or request.get("max_tokens")
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise BadRequest(f"max_tokens must be a positive integer, got {cap!r}")
    stops = request.get("stop") or []
    stop_ids = []
    for text in [stops] if isinstance(stops, str) else stops:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == 1:
            stop_ids.append(ids[0])
        else:
            warn(f"the stop text {text!r} is {len(ids)} tokens; the sampler stops on single tokens, so it is not used")
    return CallLimits(cap, tuple(stop_ids), bool(request.get("logprobs")))


def _logprob_entries(tokenizer, ids: list[int], logprobs: list[float] | None) -> list[dict]:
    entries = []
    for token_id, logprob in zip(ids, logprobs or [0.0] * len(ids)):
        token = tokenizer.decode([token_id], skip_special_tokens=False)
        entries.append({"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []})
    return entries


def chat_message(text: str, parser: ToolCallParser, reasoning_tags: tuple[str, str] | None) -> dict:
    """The assistant message of a sampled turn's text: its reasoning (between ``reasoning_tags``), text and calls."""
    reasoning = None
    if reasoning_tags is not None and reasoning_tags[1] in text:
        before, _, text = text.partition(reasoning_tags[1])
        reasoning, text = before.split(reasoning_tags[0], 1)[-1].strip(), text.lstrip()
    content, calls = parser.parse(text)
    message = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def chat_answer(
    model: str,
    message: dict,
    finish: str,
    prompt_ids: list[int],
    ids: list[int],
    logprobs,
    tokenizer,
    limits: CallLimits,
) -> dict:
    choice = {
        "index": 0,
        "message": message,
        "finish_reason": "tool_calls" if message.get("tool_calls") and finish == "stop" else finish,
        "logprobs": {"content": _logprob_entries(tokenizer, ids, logprobs)} if limits.logprobs else None,
        "token_ids": ids,
    }
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(prompt_ids, ids),
        "prompt_token_ids": prompt_ids,
    }


def completion_answer(
    model: str, text: str, finish: str, prompt_ids: list[int], ids: list[int], logprobs, tokenizer, limits: CallLimits
) -> dict:
    entries = _logprob_entries(tokenizer, ids, logprobs) if limits.logprobs else None
    offsets, at = [], 0
    for entry in entries or []:
        offsets.append(at)
        at += len(entry["token"])
    choice = {
        "index": 0,
        "text": text,
        "finish_reason": finish,
        "token_ids": ids,
        "logprobs": None
        if entries is None
        else {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "text_offset": offsets,
            "top_logprobs": None,
        },
    }
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(prompt_ids, ids),
        "prompt_token_ids": prompt_ids,
    }


def _usage(prompt_ids: list[int], ids: list[int]) -> dict:
    return {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids), "total_tokens": len(prompt_ids) + len(ids)}
