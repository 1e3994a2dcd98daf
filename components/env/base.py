"""The environment contract of multi-turn rollouts: the model's turn in; an observation, a reward and ``done`` out.

An `Environment` is configured once (YAML, like every component) and starts one episode per prompt
from the prompt's data row (``reset``); a rollout wrapper (components.rollout.MultiTurnRollout) then
calls ``step`` after each of the model's turns until it says ``done``. The observation is appended to
the transcript as environment tokens: context for the model's later turns, never trained on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple


class Turn(NamedTuple):
    """One turn of the model, exactly as sampled."""

    ids: list[int]  # the sampled token ids (ending with EOS or a stop token unless ``finish == "length"``)
    text: str  # the ids decoded (special tokens kept, so a protocol's tags are visible)
    finish: str  # "stop": EOS or a stop token ended it; "length": the turn hit its token budget
    index: int  # 0 for the first turn


class Step(NamedTuple):
    """What the environment answers to a turn."""

    observation: str | list[int] | None = None  # text (tokenised by the rollout) or token ids; None only when done
    reward: float | None = None  # a reward for this turn, added on its last token (None = nothing)
    done: bool = False  # the episode is over: no observation is appended and the model does not continue
    tool_calls: int = 0  # tool calls this turn made (logged as agent/tool_calls_mean)
    tool_errors: int = 0  # of which failed: raised, timed out, malformed or unknown (tool/error_frac)


class Environment(ABC):
    """Configured once; ``reset(row)`` starts the episode of one prompt and returns its state, which ``step`` receives.

    The state is the episode's own (any object): an environment keeps nothing per episode on itself, so one
    configured environment serves every prompt of a batch.
    """

    stop_texts: tuple[str, ...] = ()
    """Texts (one token each) that end a model turn besides EOS, e.g. a tool call's closing tag."""

    def reset(self, row: dict[str, Any]) -> Any:
        """The state of a new episode for the prompt whose data row (prompt text and every column) is ``row``."""
        return dict(row)

    @abstractmethod
    def step(self, state: Any, turn: Turn) -> Step:
        """React to the model's ``turn``; may update ``state`` in place."""

    def close(self) -> None:
        """Release what the environment started (worker processes, sandboxes)."""
