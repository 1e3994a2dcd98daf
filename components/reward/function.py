"""`FunctionReward`: any Python callable as a reward, called once per batch."""

from __future__ import annotations

from typing import Any, Callable

from torch import Tensor

from lightning_rl.batch import RolloutBatch

from .base import Reward, RewardInputs, as_scores


class FunctionReward(Reward):
    """``fn(prompts=[...], completions=[...], **columns, **kwargs) -> list[float]`` (TRL's reward-function shape).

    In YAML, ``fn`` is a dotted import path, e.g. ``my_project.rewards.correctness``.
    """

    def __init__(self, fn: Callable[..., Any], kwargs: dict[str, Any] | None = None):
        """
        Args:
            fn: the reward function (or its dotted import path).
            kwargs: extra keyword arguments passed on every call.
        """
        self.fn = fn
        self.kwargs = dict(kwargs or {})

    @property
    def name(self) -> str:
        return f"FunctionReward({getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', repr(self.fn))})"

    def __call__(self, batch: RolloutBatch, meta: RewardInputs) -> Tensor:
        try:
            values = self.fn(**meta, **self.kwargs)
        except Exception as err:
            raise RuntimeError(
                f"reward {self.name} raised {type(err).__name__}: {err} "
                f"(it was called with keyword arguments {sorted([*meta, *self.kwargs])})"
            ) from err
        return as_scores(values, batch.batch_size, self.name, meta).to(batch.response_ids.device)
