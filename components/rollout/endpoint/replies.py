"""OpenAI's response shapes for the endpoint: the JSON a call is answered with (what it asks for: parameters.py).

Chat: https://platform.openai.com/docs/api-reference/chat/create (``choices[0].message`` with ``content`` and
``tool_calls``, ``finish_reason`` stop / length / tool_calls, ``logprobs.content[i]`` {token, logprob, bytes,
top_logprobs}, ``usage``). Completions: https://platform.openai.com/docs/api-reference/completions/create
(``choices[0].text``, ``logprobs`` {tokens, token_logprobs, text_offset, top_logprobs}). Both answers add the
exact ids, as vLLM and SGLang do: ``prompt_token_ids`` and ``choices[0].token_ids``.
"""

from __future__ import annotations

import time
import uuid

from components.env.tool_calls import ToolCallParser

from .parameters import CallLimits


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
