"""`FunctionReward`: any Python callable as a reward, called once per batch."""

from __future__ import annotations

from typing import Any, Callable

from torch import Tensor

from lightning_rl.core.batch import RolloutBatch

from .base import Reward, as_scores, columns
from .deadline import DeadlineExceeded, deadline


class FunctionReward(Reward):
    """``fn(prompts=[...], completions=[...], **columns, **kwargs) -> list[float]`` (TRL's reward-function shape).

    In YAML, ``fn`` is a dotted import path, e.g. ``my_project.rewards.correctness``.
    """

    def __init__(self, fn: Callable[..., Any], kwargs: dict[str, Any] | None = None, timeout_s: float | None = 600.0):
        """
        Args:
            fn: the reward function (or its dotted import path).
            kwargs: extra keyword arguments passed on every call.
            timeout_s: fail the iteration when one call (the whole batch) takes longer (None = wait forever).
                A slow reward can run in worker processes instead: components.reward.PooledReward.
        """
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"FunctionReward: timeout_s must be > 0 seconds (or null), got {timeout_s}")
        self.fn = fn
        self.kwargs = dict(kwargs or {})
        self.timeout_s = timeout_s

    @property
    def name(self) -> str:
        return (
            f"FunctionReward({getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', repr(self.fn))})"
        )

    def __call__(self, batch: RolloutBatch) -> Tensor:
        meta = columns(batch, self.name)
        try:
            with deadline(self.timeout_s):
                values = self.fn(**meta, **self.kwargs)
        except DeadlineExceeded:
            raise TimeoutError(
                f"reward {self.name} did not return within timeout_s={self.timeout_s} s for {batch.batch_size} samples "
                "(model.reward.init_args.timeout_s). A slow reward (code execution, a judge model) can run per sample in "
                "worker processes, each with its own timeout and a score on failure: components.reward.PooledReward"
            ) from None
        except Exception as err:
            raise RuntimeError(
                f"reward {self.name} raised {type(err).__name__}: {err} "
                f"(it was called with keyword arguments {sorted([*meta, *self.kwargs])})"
            ) from err
        return as_scores(values, batch.batch_size, self.name, meta).to(batch.response_ids.device)
