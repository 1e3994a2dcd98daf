"""`ToolEnvironment`: the model calls tools until it answers without one."""

from __future__ import annotations

from typing import Any

from lightning_rl.core.contracts import Environment, Step, Turn

from .protocol import ToolProtocol
from .tools import Tool, ToolError


class ToolEnvironment(Environment):
    """Each turn that calls tools gets their results as the observation; the first turn without a call ends the episode.

    A call that raises, times out, is malformed, names no tool (with no ``default_tool``) or answers something that is
    not valid text (a lone surrogate) answers an error result instead: the model reads it and goes on, and the iteration logs it in ``tool/error_frac``.
    The final answer is judged by the configured ``reward`` (its ``completions`` are the model's last turns);
    ``error_reward`` optionally adds a per-turn reward for each failed call (e.g. -0.1).
    """

    def __init__(
        self,
        tools: list[Tool],
        protocol: ToolProtocol | None = None,
        default_tool: str | None = None,
        max_calls_per_turn: int = 4,
        error_reward: float | None = None,
    ):
        """
        Args:
            tools: the tools the model may call, by their ``name``.
            protocol: how calls and results are written (None = ``<call>name(args)</call>`` / ``<result>...</result>``).
            default_tool: the tool that answers a call whose body does not name a tool (None = such a call is an error).
            max_calls_per_turn: calls beyond this many in one turn answer an error.
            error_reward: reward added to a turn for each failed call (None = none).
        """
        names = [t.name for t in tools]
        if not tools or len(set(names)) != len(names):
            raise ValueError(f"ToolEnvironment: tools must be a non-empty list with distinct names, got {names}")
        if default_tool is not None and default_tool not in names:
            raise ValueError(f"ToolEnvironment: default_tool {default_tool!r} is not one of the tools {names}")
        if max_calls_per_turn < 1:
            raise ValueError(f"ToolEnvironment: max_calls_per_turn must be >= 1, got {max_calls_per_turn}")
        self.tools = {t.name: t for t in tools}
        self.protocol = protocol or ToolProtocol()
        self.default_tool, self.max_calls_per_turn, self.error_reward = default_tool, max_calls_per_turn, error_reward
        self._closed = False  # set by close(), cleared by the next episode: the calls of a turn under way stop at once

    @property
    def stop_texts(self) -> tuple[str, ...]:
        return (self.protocol.call_close,)

    def reset(self, row: dict[str, Any]) -> Any:
        self._closed = False
        return super().reset(row)

    def step(self, state: Any, turn: Turn) -> Step:
        calls = self.protocol.calls(turn.text)
        if not calls:
            return Step(done=True)
        results, errors = [], 0
        for i, call in enumerate(calls):
            text, failed = self._run(call, i)
            results.append(self.protocol.result(text, error=failed))
            errors += failed
        reward = self.error_reward * errors if self.error_reward is not None and errors else None
        return Step("".join(results), reward, False, len(calls), errors)

    def _run(self, call, index: int) -> tuple[str, bool]:
        text, failed = self._answer(call, index)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:  # e.g. bytes decoded with surrogateescape: no tokenizer can encode it
            return (
                f"the tool's {'error' if failed else 'result'} is not valid text ({err.reason} at character {err.start})",
                True,
            )
        return text, failed

    def _answer(self, call, index: int) -> tuple[str, bool]:
        if self._closed:
            return "the environment was closed", True
        if call.error is not None:
            return f"malformed call: {call.error}", True
        if index >= self.max_calls_per_turn:
            return f"at most {self.max_calls_per_turn} calls per turn", True
        if call.name in self.tools:
            tool, arguments = self.tools[call.name], call.arguments
        elif self.default_tool is not None:
            tool, arguments = self.tools[self.default_tool], call.body
        elif call.name is not None:
            return f"unknown tool {call.name!r}; the tools are {sorted(self.tools)}", True
        else:
            return (
                f"no tool named in {call.body[:40]!r}; write name(arguments) with a tool from {sorted(self.tools)}",
                True,
            )
        try:
            result = tool(arguments)
        except Exception as err:  # the model's call failed, not the run: it reads why
            return str(err) if isinstance(err, ToolError) else f"{type(err).__name__}: {err}", True
        if not isinstance(result, str):
            return f"the tool {tool.name!r} answered a {type(result).__name__}, not text", True
        return result, False

    def close(self) -> None:
        self._closed = True
        for tool in self.tools.values():
            tool.close()
