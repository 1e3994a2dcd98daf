"""`ToolProtocol`: how a tool call is written in the model's turn and how its result is written back.

Calls are found by components.env.tool_calls.TaggedCalls, the grammar the OpenAI endpoint's parsers read calls with.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .tool_calls import TaggedCalls


class Call(NamedTuple):
    body: str  # the text between the tags, stripped
    name: str | None = None  # the tool named as name(arguments), if the body has that form
    arguments: str = ""  # the text inside the parentheses
    error: str | None = None  # a malformed call: what is wrong with it


class ToolProtocol:
    """Calls are ``<call>name(arguments)</call>`` in the model's text; results come back as ``<result>...</result>``.

    A body that is not ``name(arguments)`` with a tool's ``name`` goes whole to the environment's default
    tool, if it has one (so a calculator can be called as ``<call>12*7</call>``). A call opened but never closed (the turn ended
    first) is malformed. ``call_close`` is the stop text: a sampler that stops on it hands the call to the
    environment at once (MultiTurnRollout adds its token to the sampler's stop tokens).
    """

    def __init__(
        self,
        call_open: str = "<call>",
        call_close: str = "</call>",
        result_open: str = "<result>",
        result_close: str = "</result>",
        max_result_chars: int = 1000,
    ):
        """
        Args:
            call_open: text that opens a tool call in the model's turn.
            call_close: text that closes it (the turn stops there).
            result_open: text before a tool's result in the observation.
            result_close: text after it.
            max_result_chars: longer results are cut to this many characters (marked with "...").
        """
        if not call_open or not call_close:
            raise ValueError("ToolProtocol: call_open and call_close must be non-empty")
        if max_result_chars < 1:
            raise ValueError(f"ToolProtocol: max_result_chars must be >= 1, got {max_result_chars}")
        self.call_open, self.call_close = call_open, call_close
        self.result_open, self.result_close = result_open, result_close
        self.max_result_chars = max_result_chars
        self.tags = TaggedCalls(call_open, call_close)

    def calls(self, text: str) -> list[Call]:
        """Every call in ``text``, in order."""
        found = []
        for body, closed in self.tags.find(text):
            if not closed:
                found.append(Call(body, error=f"the call was not closed with {self.call_close!r}"))
                continue
            named = re.fullmatch(r"([A-Za-z_]\w*)\((.*)\)", body, re.DOTALL)
            found.append(Call(body, named.group(1), named.group(2)) if named else Call(body))
        return found

    def result(self, text: str, error: bool = False) -> str:
        """One result as observation text."""
        text = f"error: {text}" if error else text
        if len(text) > self.max_result_chars:
            text = text[: self.max_result_chars - 3] + "..."
        return f"{self.result_open}{text}{self.result_close}"
