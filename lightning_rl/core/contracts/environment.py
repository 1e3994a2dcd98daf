"""The environment contract of multi-turn rollouts: the model's turn in; an observation, a reward and ``done`` out.

An `Environment` is configured once (YAML, like every component) and starts one episode per prompt
from the prompt's data row (``reset``); a rollout wrapper (components.rollout.MultiTurnRollout) then
calls ``step`` after each of the model's turns until it says ``done``. The observation is appended to
the transcript as environment tokens: context for the model's later turns, never trained on.
"""

from __future__ import annotations

import math
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


def checked_step(env: Environment, step: Any) -> Step:
    """``step`` if it keeps the contract; else one error naming ``env`` (an environment's bug, reported where it is made)."""
    who = f"{type(env).__name__}.step"
    if not isinstance(step, Step):
        raise TypeError(
            f"{who} returned a {type(step).__name__}; it must return lightning_rl.core.contracts.Step(observation, reward, done)"
        )
    if not isinstance(step.done, bool):
        raise TypeError(f"{who} returned done={step.done!r}; it must be True or False")
    if step.reward is not None and not (isinstance(step.reward, (int, float)) and math.isfinite(step.reward)):
        raise TypeError(f"{who} returned reward={step.reward!r}; it must be a finite number or None")
    if not step.done and not (isinstance(step.observation, str) or _is_ids(step.observation)):
        raise TypeError(
            f"{who} returned observation={step.observation!r:.80} with done=False; an episode that goes on needs a str or a list of token ids"
        )
    if isinstance(step.observation, str) and not step.done:
        try:
            step.observation.encode("utf-8")
        except UnicodeEncodeError as err:  # a tokenizer would fail on it, far from the culprit
            raise ValueError(
                f"{who} returned an observation that is not valid text ({err.reason} at character {err.start}: "
                f"{step.observation[max(0, err.start - 20) : err.end + 20]!r}); decode bytes with errors='replace'"
            ) from None
    counts = (step.tool_calls, step.tool_errors)
    if not all(_is_int(c) and c >= 0 for c in counts) or step.tool_errors > step.tool_calls:
        raise TypeError(
            f"{who} returned tool_calls={step.tool_calls!r}, tool_errors={step.tool_errors!r}; they must be integers "
            "with 0 <= tool_errors <= tool_calls"
        )
    return step


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_ids(value) -> bool:
    return isinstance(value, (list, tuple)) and all(_is_int(t) for t in value)
