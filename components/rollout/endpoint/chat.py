"""What the endpoint adds to the chat template (components.rollout.chat_turns): token budgets, and what identifies a message.

Text that cannot fit its token budget is refused before it is tokenised (`encode_within`): no token holds more bytes
than the vocabulary's longest token, so ``bytes / longest`` tokens at least. Tokenising a 5 MB message with a
character-level tokenizer took 14 s and 1.9 GB of memory, for a prompt the policy could never read.
"""

from __future__ import annotations

import json

from ..chat_turns import call_arguments, text_of


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


def normalized(message: dict) -> dict:
    """What identifies a message: its role, text, reasoning, calls (by name and decoded arguments), tool call id and
    name. Two messages are the same turn when these agree, whatever else a client sends along (ids, refusal: null)."""
    if not isinstance(message, dict) or "role" not in message:
        raise ValueError(f"every message needs a role; got {message!r:.120}")
    calls = [
        (
            call.get("function", {}).get("name"),
            json.dumps(call_arguments(call.get("function", {}).get("arguments")), sort_keys=True),
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
