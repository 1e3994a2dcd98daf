"""`FunctionReward`: any Python callable as a reward, called once per batch (TRL's reward-function shape).

The columns a function reads are its named parameters: ``fn(prompts, completions, answer, **kwargs)`` reads the data
column ``answer``, and the run checks that the data delivers it before any model loads. A function without
``**kwargs`` gets only the columns it names (TRL requires ``**kwargs``; here it is optional).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Reward, RewardInputs, as_scores
from lightning_rl.core.contracts.reward import ROLLOUT_COLUMNS, OnFailure, columns

from .deadline import DeadlineExceeded, deadline


def function_name(fn: Callable[..., Any]) -> str:
    """``my_project.rewards.correctness``: how a config names ``fn`` (a callable object: by its class)."""
    named = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{named.__module__}.{named.__qualname__}"


def short_name(fn: Callable[..., Any]) -> str:
    """``correctness``: ``fn``'s own name, a tag where the dotted path would read as folders."""
    return function_name(fn).rsplit(".", 1)[-1]


def _named_parameters(fn: Callable[..., Any]) -> tuple[dict[str, inspect.Parameter], bool] | None:
    """``fn``'s parameters by name and whether it takes ``**kwargs``; None when Python cannot tell (a builtin)."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return dict(parameters), takes_any


def columns_read(fn: Callable[..., Any], given: set[str]) -> frozenset[str]:
    """The data columns ``fn`` needs: its parameters without a default, less those the loop fills (prompts,
    completions, an agent's transcripts) and ``given`` (the reward's fixed keyword arguments)."""
    found = _named_parameters(fn)
    if found is None:
        return frozenset()
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    required = {n for n, p in found[0].items() if p.kind in named and p.default is inspect.Parameter.empty}
    return frozenset(required - ROLLOUT_COLUMNS - given)


def accepted(fn: Callable[..., Any], inputs: RewardInputs) -> RewardInputs:
    """The columns ``fn`` takes: all of them when it has ``**kwargs``, else only those it names."""
    found = _named_parameters(fn)
    if found is None or found[1]:
        return inputs
    return {k: v for k, v in inputs.items() if k in found[0]}


class FunctionReward(Reward):
    """``fn(prompts=[...], completions=[...], **columns, **kwargs) -> list[float]`` (TRL's reward-function shape).

    In YAML, ``fn`` is a dotted import path, e.g. ``my_project.rewards.correctness``. Each data column reaches it under
    its ``data.columns`` name (``answer`` for ``data.columns: {answer: solution}``).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        kwargs: dict[str, Any] | None = None,
        timeout_s: float | None = 600.0,
        on_failure: OnFailure = "raise",
        failure_score: float = 0.0,
    ):
        """
        Args:
            fn: the reward function (or its dotted import path).
            kwargs: extra keyword arguments passed on every call.
            timeout_s: fail the iteration when one call (the whole batch) takes longer (None = wait forever).
                A slow reward can run in worker processes instead: components.reward.PooledReward.
            on_failure: a row on which ``fn`` raises (or returns no finite number): ``raise`` stops the run naming the
                row; ``score`` gives it ``failure_score``, counted in ``reward/error_frac``.
            failure_score: the score of such a row with ``on_failure: score``.
        """
        super().__init__(on_failure, failure_score)
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"FunctionReward: timeout_s must be > 0 seconds (or null), got {timeout_s}")
        self.fn = fn
        self.kwargs = dict(kwargs or {})
        self.timeout_s = timeout_s

    @property
    def name(self) -> str:
        return f"FunctionReward({function_name(self.fn)})"

    @property
    def part_name(self) -> str:
        return short_name(self.fn)

    def data_columns(self) -> frozenset[str]:
        """``fn``'s named parameters without a default, less prompts, completions and ``kwargs``."""
        return columns_read(self.fn, set(self.kwargs))

    def __call__(self, batch: RolloutBatch) -> Tensor:
        meta = accepted(self.fn, columns(batch, self.name))
        try:
            with deadline(self.timeout_s):
                values = self.fn(**meta, **self.kwargs)
        except DeadlineExceeded:
            raise TimeoutError(
                f"reward {self.name} did not return within timeout_s={self.timeout_s} s for {batch.batch_size} samples "
                "(model.reward.init_args.timeout_s). A slow reward (code execution, a judge model) can run per sample in "
                "worker processes, each with its own timeout and a score on failure: components.reward.PooledReward"
            ) from None
        return as_scores(values, batch.batch_size, self.name, meta).to(batch.response_ids.device)
