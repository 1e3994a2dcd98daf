"""Tool calls as the model writes them: the one grammar `ToolProtocol` (MultiTurnRollout's environments) and the OpenAI
endpoint read calls with.

`TaggedCalls` finds calls written between an open and a close tag (``<call>...</call>``, ``<tool_call>...</tool_call>``);
the close tag is the stop text on which a sampler can end the turn (`stop_token_ids`). ToolProtocol reads each body as
``name(arguments)``; the endpoint's parsers read a turn into OpenAI's ``tool_calls``: each knows one family's convention
and splits a turn into its text and its calls ``[{"id", "type": "function", "function": {"name", "arguments": <JSON
text>}}]`` (a chat template renders the tool definitions and the calls of earlier turns; the model's own turn is text).
The model's JSON is read by lightning_rl.core.untrusted_json: a call nested past its ``MAX_DEPTH`` (``{"arguments":
[[[[...`` 1,000 deep ended the round's sampling) or holding a number no float holds is malformed, and stays in the
turn's text.
"""

from __future__ import annotations

import json
import re
import uuid
import warnings
from collections.abc import Iterable
from typing import Any

from lightning_rl.core import untrusted_json


class TaggedCalls:
    """Calls written as ``open_tag body close_tag``; a call opened and never closed runs to the end of the text."""

    def __init__(self, open_tag: str, close_tag: str):
        self.open_tag, self.close_tag = open_tag, close_tag
        self._call = re.compile(re.escape(open_tag) + r"(.*?)(?:(" + re.escape(close_tag) + r")|$)", re.DOTALL)

    def find(self, text: str) -> list[tuple[str, bool]]:
        """(body, closed) of every call in ``text``, in order; the body stripped."""
        return [(match.group(1).strip(), match.group(2) is not None) for match in self._call.finditer(text)]

    def closed(self, text: str) -> list[str]:
        """The bodies of the closed calls in ``text``, in order."""
        return [body for body, closed in self.find(text) if closed]

    def outside(self, text: str) -> str:
        """``text`` without its closed calls, stripped (an unclosed call stays)."""
        return self._call.sub(lambda match: "" if match.group(2) is not None else match.group(0), text).strip()


def stop_token_ids(tokenizer, stop_texts: Iterable[str], setting: str) -> list[int]:
    """The id of each of ``stop_texts`` that is one token for ``tokenizer``; a sampler stops on single tokens, so each
    that is not is left out with a warning naming ``setting``, where the stop text comes from."""
    ids = []
    for text in stop_texts:
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) != 1:
            warnings.warn(
                f"{setting}: the stop text {text!r} is {len(encoded)} tokens for this tokenizer and a sampler stops on "
                "single tokens: a turn then runs on to its end-of-turn token, EOS or max_new_tokens (its calls are still "
                "read). Add the text to the tokenizer as one token, or write calls with a closing tag that is one token"
            )
            continue
        ids.append(encoded[0])
    return ids


def tool_call(name: str, arguments: Any) -> dict:
    """One call in OpenAI's format (``arguments`` is JSON text, as the API sends it)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": text}}


class ToolCallParser:
    """No tool calls: the whole turn is text."""

    stop_texts: tuple[str, ...] = ()
    """Texts (one token each) after which the model's turn ends, e.g. a call's closing tag."""

    def parse(self, text: str) -> tuple[str, list[dict]]:
        """(the turn's text outside its calls, the calls)."""
        return text, []


class HermesToolCalls(ToolCallParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, as Qwen2.5/Qwen3 and Hermes templates write them."""

    def __init__(self, open_tag: str = "<tool_call>", close_tag: str = "</tool_call>"):
        """
        Args:
            open_tag: the text that opens a call.
            close_tag: the text that closes it.
        """
        self.tags = TaggedCalls(open_tag, close_tag)

    def parse(self, text: str) -> tuple[str, list[dict]]:
        calls = []
        for body in self.tags.closed(text):
            try:
                call = untrusted_json.loads(body)
                calls.append(tool_call(call["name"], call.get("arguments", call.get("parameters", {}))))
            except (ValueError, KeyError, TypeError):  # malformed: left in the text for the agent to see
                return text, []
        return (self.tags.outside(text) if calls else text), calls


class JsonToolCalls(ToolCallParser):
    """A turn that is one JSON object ``{"name": ..., "parameters": {...}}`` is a call, as Llama 3.1/3.2 write them."""

    def parse(self, text: str) -> tuple[str, list[dict]]:
        stripped = text.strip()
        if stripped.startswith("<|python_tag|>"):
            stripped = stripped[len("<|python_tag|>") :]
        try:
            call = untrusted_json.loads(stripped)
        except ValueError:
            return text, []
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return text, []
        return "", [tool_call(call["name"], call.get("parameters", call.get("arguments", {})))]


class TagToolCalls(ToolCallParser):
    """``<call>body</call>``: one tool, its one argument the body (the shipped tiny tool-using policy's convention)."""

    def __init__(self, name: str, argument: str, open_tag: str = "<call>", close_tag: str = "</call>"):
        """
        Args:
            name: the tool every call names.
            argument: the argument that receives the body.
            open_tag: the text that opens a call.
            close_tag: the text that closes it (the turn stops there).
        """
        self.name, self.argument, self.tags = name, argument, TaggedCalls(open_tag, close_tag)
        self.stop_texts = (close_tag,)

    def parse(self, text: str) -> tuple[str, list[dict]]:
        calls = [tool_call(self.name, {self.argument: body}) for body in self.tags.closed(text)]
        return (self.tags.outside(text) if calls else text), calls
