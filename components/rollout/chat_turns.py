"""`ChatTemplate`: a chat template's turns as text: a whole conversation once, then only what each turn appends.

One segmenter for both multi-turn stacks: `MultiTurnRollout` appends an environment's observation after each model
turn (``chat_template: true``), and the OpenAI endpoint (components.rollout.endpoint.conversation) appends the new
messages of each call. ``prompt`` renders a whole conversation (the first call of a training row). ``suffix`` renders
a stand-in user and assistant turn followed by the new messages; the new segment is everything after the stand-in's
content (the end of the assistant turn, the new turns, the next assistant header), less the end-of-turn token the
model already sampled. Earlier turns are never rendered again, so a template that rewrites history (drops an earlier
turn's reasoning) cannot change the ids that were sampled.

The two callers differ in how much they ask of the template (``append_only``): `MultiTurnRollout` requires that the
new turns only append to what the template rendered before them, and raises otherwise; the endpoint takes whatever
follows the stand-in's content, so how the template renders earlier turns does not matter.
"""

from __future__ import annotations

from typing import Any

from lightning_rl.core import untrusted_json

_USER, _ASSISTANT = "USER_TEXT_1f3a", "ASSISTANT_TEXT_7c2e"
_STAND_IN = ({"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT})


def text_of(content: Any) -> str:
    """A message's content as text: a string, or OpenAI's list of parts (their text joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    raise ValueError(f"message content must be text or a list of text parts, got {type(content).__name__}")


def call_arguments(text: Any) -> Any:
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


def template_message(message: dict) -> dict:
    """A message as chat templates read it: text content, and call arguments as a mapping (as transformers documents)."""
    out = {k: v for k, v in message.items() if v is not None}
    out["content"] = text_of(message.get("content"))  # an assistant turn with only calls may omit it; templates read it
    if message.get("tool_calls"):
        calls = []
        for call in message["tool_calls"]:
            function = dict(call.get("function", {}))
            function["arguments"] = call_arguments(function.get("arguments", {}))
            calls.append({**call, "function": function})
        out["tool_calls"] = calls
    return out


class ChatTemplate:
    """The tokenizer's chat template (or ``template``, a Jinja string that replaces it), rendered as turns.

    The tokenizer must have a template when ``template`` is None: each caller checks that first, with its own fix.
    """

    def __init__(self, tokenizer, template: str | None = None):
        self.tokenizer, self.template = tokenizer, template
        self.stand_in = self.render(list(_STAND_IN), None, False)
        if _ASSISTANT not in self.stand_in:
            raise ValueError(
                "the chat template does not render an assistant message's content: turns cannot be appended to it"
            )
        self.end_of_turn = self._end_of_turn(self.stand_in)  # e.g. "<|im_end|>\n"

    def render(self, messages: list[dict], tools: list[dict] | None, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            [template_message(m) for m in messages],
            tools=tools or None,
            chat_template=self.template,
            add_generation_prompt=generation_prompt,
            tokenize=False,
        )

    @staticmethod
    def _end_of_turn(rendered: str) -> str:
        """What the template wrote after the stand-in assistant's content (its last occurrence) in ``rendered``."""
        return rendered[rendered.rindex(_ASSISTANT) + len(_ASSISTANT) :]

    def end_of_turn_id(self) -> int | None:
        """The token that ends an assistant turn (a stop token), when the template closes turns with one."""
        ids = self.tokenizer.encode(self.end_of_turn, add_special_tokens=False) if self.end_of_turn.strip() else []
        return ids[0] if ids else None

    def prompt(self, messages: list[dict], tools: list[dict] | None) -> str:
        """The whole conversation, ready for the assistant's turn."""
        return self.render(messages, tools, True)

    def suffix(
        self, messages: list[dict], tools: list[dict] | None, turn_ids: list[int], append_only: bool = False
    ) -> str:
        """The new ``messages`` after a model turn that ended with ``turn_ids``, and the next assistant header.

        ``append_only``: the template must render the conversation before ``messages`` unchanged once they follow
        (a `ValueError` otherwise); the end of the model's turn is then what the template wrote after it when it was
        the last turn, and only that part can hold the end-of-turn token the model sampled. Else the segment is all
        that follows the stand-in's content (its last occurrence) in the new rendering, and the model's end-of-turn
        token is dropped from its start.
        """
        text = self.render([*_STAND_IN, *messages], tools, True)
        if append_only:
            before = self.stand_in if not tools else self.render(list(_STAND_IN), tools, False)
            if not text.startswith(before):
                raise ValueError(
                    f"the chat template renders the conversation differently once a {messages[0]['role']!r} turn "
                    "follows: it cannot append turns"
                )
            ending, new = self._end_of_turn(before), text[len(before) :]
        else:
            ending, new = self._end_of_turn(text), ""
        if turn_ids:  # the model's own end-of-turn token is already in the transcript
            ended = self.tokenizer.decode(turn_ids[-1:], skip_special_tokens=False)
            if ended and ending.startswith(ended):
                ending = ending[len(ended) :]
        return ending + new
