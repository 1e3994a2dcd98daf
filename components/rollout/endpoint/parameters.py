"""What a call to the endpoint asks for: OpenAI's request parameters, checked before the call reaches the sampler.

Chat: https://platform.openai.com/docs/api-reference/chat/create; completions:
https://platform.openai.com/docs/api-reference/completions/create. The endpoint honours what it can exactly (a length
cap, single-token stop texts, the sampled tokens' log-probs) and refuses the rest with a 400 naming it, including a
value of the wrong type, which would otherwise raise far from the request (``"n": 1e999`` ended a run).
"""

from __future__ import annotations

from dataclasses import dataclass


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


def _whole(request: dict, key: str, default: int) -> int:
    """``request[key]``, a whole number (``default`` when absent or null); anything else is a `BadRequest` (a float or a
    huge number would raise far from the request: ``int(1e999)`` is an OverflowError)."""
    value = request.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{key} must be a whole number, got {value!r:.60}")
    return value


def _logprobs(request: dict, route: str) -> bool:
    """Whether the answer carries the sampled tokens' log-probs: chat's ``logprobs`` is true or false; a completion's
    is how many top log-probs per token (0 or 1: the sampled token's own)."""
    value = request.get("logprobs")
    if value is None or isinstance(value, bool):
        return bool(value)
    if route == "chat.completions":
        raise BadRequest(f"logprobs must be true or false, got {value!r:.60}")
    count = _whole(request, "logprobs", 0)
    if not 0 <= count <= 1:
        raise BadRequest(
            f"logprobs {count} is not supported: the sampler reports the log-prob of the sampled token only (logprobs: 1)"
        )
    return count == 1


def _stop_texts(request: dict) -> list[str]:
    stop = request.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if not isinstance(stop, list) or not all(isinstance(text, str) for text in stop):
        raise BadRequest(f"stop must be a text or a list of texts, got {stop!r:.60}")
    return stop


def call_limits(request: dict, route: str, model_name: str, tokenizer, warn) -> CallLimits:
    """The request's length cap, stop tokens and logprobs flag; refuses (`BadRequest`) what cannot be honoured exactly:
    another model, ``n`` > 1, streaming, ``top_logprobs``, a forced or disabled tool choice, a structured response
    format, a logit bias, ``echo``, ``best_of``, ``parallel_tool_calls: false`` and any parameter it does not know; and
    a value of the wrong type (``n`` or ``logprobs`` that is not a whole number, ``stop`` that is not text).
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
    if _whole(request, "n", 1) != 1 or _whole(request, "best_of", 1) != 1:
        raise BadRequest(
            "n must be 1 (and best_of 1): each call is one turn of the episode (run the agent several times for several samples)"
        )
    if _whole(request, "top_logprobs", 0) != 0:
        raise BadRequest(
            "top_logprobs is not supported: the sampler reports the log-prob of the sampled token only (logprobs: true)"
        )
    logprobs = _logprobs(request, route)
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
    stop_ids = []
    for text in _stop_texts(request):
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == 1:
            stop_ids.append(ids[0])
        else:
            warn(f"the stop text {text!r} is {len(ids)} tokens; the sampler stops on single tokens, so it is not used")
    return CallLimits(cap, tuple(stop_ids), logprobs)
