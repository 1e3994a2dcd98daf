"""Chat messages to token ids for an OpenAI endpoint: a whole conversation once, then only what each call adds.

``prompt_ids`` renders the tokenizer's chat template over a conversation (the first call of a training row).
``suffix_ids`` is the tokens of new messages appended after a model turn that was sampled: the template is rendered
for a stand-in assistant turn followed by the new messages, and everything after the stand-in's content is the new
segment (the end of the assistant turn, the new turns, the next assistant header), less the end-of-turn token the
model already sampled. Earlier turns are never rendered again, so a template that rewrites history (drops an earlier
turn's reasoning) cannot change the ids that were sampled; the segment is cut after the stand-in's content, not
after a rendered prefix, so how the template renders earlier turns does not matter either.

Text that cannot fit its token budget is refused before it is tokenised (`encode_within`): no token holds more bytes
than the vocabulary's longest token, so ``bytes / longest`` tokens at least. Tokenising a 5 MB message with a
character-level tokenizer took 14 s and 1.9 GB of memory, for a prompt the policy could never read.
"""

from __future__ import annotations

import json
from typing import Any

from lightning_rl.core import untrusted_json

_USER, _ASSISTANT = "USER_TEXT_1f3a", "ASSISTANT_TEXT_7c2e"


class ContextFull(ValueError):
    """A prompt or the tokens a call adds pass their budget (the policy's context, or ``max_total_tokens``)."""


def longest_token_bytes(tokenizer) -> int:
    """Most bytes of text one token of ``tokenizer`` can stand for (its vocabulary's longest entry, in UTF-8: byte-level
    and SentencePiece pieces spell a byte or a space with a longer character, so this bounds from above)."""
    return max((len(token.encode()) for token in tokenizer.get_vocab()), default=1) or 1


def encode_within(tokenizer, text: str, max_tokens: int | None, longest: int, too_long) -> list[int]:
    """``text``'s ids; when it cannot be ``max_tokens`` tokens or fewer (None = no bound) ``too_long(at_least)`` is
    raised without tokenising it (``at_least``: a lower bound on its tokens)."""
    if max_tokens is not None:
        at_least = -(-len(text.encode("utf-8", "surrogatepass")) // longest)
        if at_least > max_tokens:
            raise too_long(at_least)
    return tokenizer.encode(text, add_special_tokens=False)


def text_of(content: Any) -> str:
    """A message's content as text: a string, or OpenAI's list of parts (their text joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    raise ValueError(f"message content must be text or a list of text parts, got {type(content).__name__}")


def _arguments(text: Any) -> Any:
    """A call's arguments as a value: JSON text decoded, text that is not JSON kept as text; arguments nested past
    untrusted_json.MAX_DEPTH are a `ValueError` (the request's 400) before anything recurses into them."""
    if not isinstance(text, str):
        return text
    if untrusted_json.nests_deeper_than(text, untrusted_json.MAX_DEPTH):
        raise ValueError(f"a tool call's arguments nest arrays and objects more than {untrusted_json.MAX_DEPTH} deep")
    try:
        return untrusted_json.loads(text)
    except ValueError:
        return text


def normalized(message: dict) -> dict:
    """What identifies a message: its role, text, reasoning, calls (by name and decoded arguments), tool call id and
    name. Two messages are the same turn when these agree, whatever else a client sends along (ids, refusal: null)."""
    if not isinstance(message, dict) or "role" not in message:
        raise ValueError(f"every message needs a role; got {message!r:.120}")
    calls = [
        (
            call.get("function", {}).get("name"),
            json.dumps(_arguments(call.get("function", {}).get("arguments")), sort_keys=True),
        )
        for call in message.get("tool_calls") or []
    ]
    return {
        "role": message["role"],
        "content": text_of(message.get("content")).strip(),
        "reasoning": text_of(message.get("reasoning_content")).strip(),
        "tool_calls": calls,
        "tool_call_id": message.get("tool_call_id"),
        "name": message.get("name"),
    }


def template_message(message: dict) -> dict:
    """A message as chat templates read it: text content, and call arguments as a mapping (as transformers documents)."""
    out = {k: v for k, v in message.items() if v is not None}
    out["content"] = text_of(message.get("content"))  # an assistant turn with only calls may omit it; templates read it
    if message.get("tool_calls"):
        calls = []
        for call in message["tool_calls"]:
            function = dict(call.get("function", {}))
            function["arguments"] = _arguments(function.get("arguments", {}))
            calls.append({**call, "function": function})
        out["tool_calls"] = calls
    return out


class ChatTemplate:
    """The tokenizer's chat template (or ``template``, a Jinja string that replaces it) for one endpoint."""

    def __init__(self, tokenizer, template: str | None = None):
        self.tokenizer, self.template = tokenizer, template or getattr(tokenizer, "chat_template", None)
        if not self.template:
            raise ValueError(
                "the policy's tokenizer has no chat template, which /v1/chat/completions needs: set "
                "model.agent.init_args.chat_template (a Jinja template, or a file holding one), or call /v1/completions"
            )
        text = self._render(
            [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT}], None, False
        )
        if _ASSISTANT not in text:
            raise ValueError(
                "the chat template does not render an assistant message's content; the endpoint cannot append turns to it"
            )
        self.end_of_turn = text[text.rindex(_ASSISTANT) + len(_ASSISTANT) :]  # e.g. "<|im_end|>\n"
        self.longest = longest_token_bytes(tokenizer)

    def _render(self, messages: list[dict], tools: list[dict] | None, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            [template_message(m) for m in messages],
            tools=tools or None,
            chat_template=self.template,
            add_generation_prompt=generation_prompt,
            tokenize=False,
        )

    def end_of_turn_id(self) -> int | None:
        """The token that ends an assistant turn (a stop token), when the template closes turns with one."""
        ids = self.tokenizer.encode(self.end_of_turn, add_special_tokens=False) if self.end_of_turn.strip() else []
        return ids[0] if ids else None

    def prompt_ids(
        self, messages: list[dict], tools: list[dict] | None, max_tokens: int | None = None, too_long=ContextFull
    ) -> list[int]:
        """The whole conversation, ready for the assistant's turn (``encode_within`` ``max_tokens``)."""
        return encode_within(self.tokenizer, self._render(messages, tools, True), max_tokens, self.longest, too_long)

    def suffix_ids(
        self,
        messages: list[dict],
        tools: list[dict] | None,
        turn_ids: list[int],
        max_tokens: int | None = None,
        too_long=ContextFull,
    ) -> list[int]:
        """The new ``messages`` after a model turn that ended with ``turn_ids``, and the next assistant header
        (``encode_within`` ``max_tokens``)."""
        stand_in = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT}]
        text = self._render(stand_in + list(messages), tools, True)
        segment = text[text.rindex(_ASSISTANT) + len(_ASSISTANT) :]
        if turn_ids:  # the model's own end-of-turn token is already in the row
            ended = self.tokenizer.decode(turn_ids[-1:], skip_special_tokens=False)
            if ended and segment.startswith(ended):
                segment = segment[len(ended) :]
        return encode_within(self.tokenizer, segment, max_tokens, self.longest, too_long)
