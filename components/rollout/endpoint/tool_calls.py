"""Tool calls as the model writes them, read into OpenAI's ``tool_calls`` format (the parsers of an OpenAI endpoint).

A chat template renders the tool definitions and the calls of earlier turns; the model's own turn is text, and its
calls have to be found in it. Each parser knows one family's convention and splits a turn into its text and its calls
``[{"id", "type": "function", "function": {"name", "arguments": <JSON text>}}]``. The model's JSON is read by
lightning_rl.core.untrusted_json: a call nested past its ``MAX_DEPTH`` (``{"arguments": [[[[...`` 1,000 deep ended the
round's sampling) or holding a number no float holds is malformed, and stays in the turn's text.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from lightning_rl.core import untrusted_json


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
        self.open_tag, self.close_tag = open_tag, close_tag
        self._call = re.compile(re.escape(open_tag) + r"(.*?)" + re.escape(close_tag), re.DOTALL)

    def parse(self, text: str) -> tuple[str, list[dict]]:
        calls = []
        for body in self._call.findall(text):
            try:
                call = untrusted_json.loads(body.strip())
                calls.append(tool_call(call["name"], call.get("arguments", call.get("parameters", {}))))
            except (ValueError, KeyError, TypeError):  # malformed: left in the text for the agent to see
                return text, []
        return (self._call.sub("", text).strip() if calls else text), calls


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
        self.name, self.argument, self.open_tag, self.close_tag = name, argument, open_tag, close_tag
        self.stop_texts = (close_tag,)
        self._call = re.compile(re.escape(open_tag) + r"(.*?)" + re.escape(close_tag), re.DOTALL)

    def parse(self, text: str) -> tuple[str, list[dict]]:
        calls = [tool_call(self.name, {self.argument: body.strip()}) for body in self._call.findall(text)]
        return (self._call.sub("", text).strip() if calls else text), calls
