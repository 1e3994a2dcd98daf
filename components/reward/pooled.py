"""`PooledReward`: a slow reward function run per sample in worker processes, each call with its own timeout."""

from __future__ import annotations

import math
import multiprocessing
import time
import weakref
from collections.abc import Sized
from typing import Any, Callable, Literal

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Reward, as_scores
from lightning_rl.core.contracts.reward import OnFailure, columns, failure_line
from lightning_rl.core.errors import RewardError

from .deadline import DeadlineExceeded, deadline
from .function import accepted, columns_read, function_name, short_name

GRACE_S = 5.0
"""Slack on the whole batch's bound, for calls a worker could not interrupt (stuck in C code)."""


def _score_sample(fn: Callable[..., Any], inputs: dict[str, Any], timeout_s: float) -> tuple[str, Any]:
    """In a worker: ("ok", scores) | ("timeout", None) | ("error", "Type: message")."""
    try:
        with deadline(timeout_s):
            return "ok", fn(**inputs)
    except DeadlineExceeded:
        return "timeout", None
    except Exception as err:
        return "error", f"{type(err).__name__}: {err}"


class PooledReward(Reward):
    """``fn`` with FunctionReward's shape (``fn(prompts=[...], completions=[...], **columns) -> scores``), called once per
    sample, with lists of length 1, by a pool of ``workers`` processes in parallel over the batch.

    For rewards that wait (code execution, an LLM judge, a remote verifier): B samples take about
    ceil(B / workers) calls' time instead of B. Each call has ``timeout_s``; a call that times out or
    raises gets ``failure_score`` (``on_failure: score``) or fails the iteration naming the sample
    (``on_failure: raise``). ``reward/timeout_frac`` and ``reward/error_frac`` are logged each iteration.
    Workers are forked from the trainer (``start_method: fork``, fast) unless another start method is
    given (``spawn`` for rewards that use CUDA); a pool with a stuck worker is replaced.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        workers: int = 8,
        timeout_s: float = 60.0,
        on_failure: OnFailure = "score",
        failure_score: float = 0.0,
        kwargs: dict[str, Any] | None = None,
        start_method: Literal["fork", "spawn", "forkserver"] = "fork",
    ):
        """
        Args:
            fn: the per-sample reward function (or its dotted import path); must be importable (no lambdas).
            workers: worker processes.
            timeout_s: seconds one sample's call may take.
            on_failure: ``score``: a timed-out or failed sample gets ``failure_score``; ``raise``: the iteration fails.
            failure_score: the score of a sample whose call timed out or raised.
            kwargs: extra keyword arguments passed on every call.
            start_method: how worker processes start.
        """
        super().__init__(on_failure, failure_score)
        if workers < 1 or timeout_s <= 0:
            raise ValueError(f"PooledReward: workers ({workers}) must be >= 1 and timeout_s ({timeout_s}) > 0")
        self.fn, self.workers, self.timeout_s, self.kwargs = fn, workers, timeout_s, dict(kwargs or {})
        self.start_method = start_method
        self._pool = None
        self.last_metrics: dict[str, Tensor] = {}

    @property
    def name(self) -> str:
        return f"PooledReward({function_name(self.fn)})"

    @property
    def part_name(self) -> str:
        return short_name(self.fn)

    def data_columns(self) -> frozenset[str]:
        """``fn``'s named parameters without a default, less prompts, completions and ``kwargs``."""
        return columns_read(self.fn, set(self.kwargs))

    def _get_pool(self):
        if self._pool is None:
            self._pool = multiprocessing.get_context(self.start_method).Pool(self.workers)
            weakref.finalize(self, self._pool.terminate)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None

    def __call__(self, batch: RolloutBatch) -> Tensor:
        meta = accepted(self.fn, columns(batch, self.name))
        n = batch.batch_size
        pool = self._get_pool()
        calls = [
            pool.apply_async(
                _score_sample, (self.fn, {**{k: [v[i]] for k, v in meta.items()}, **self.kwargs}, self.timeout_s)
            )
            for i in range(n)
        ]
        # every call interrupts itself after timeout_s; this bounds the batch when one cannot
        bound = time.monotonic() + self.timeout_s * math.ceil(n / self.workers) + GRACE_S
        scores, timeouts, errors, stuck = [], 0, 0, False
        for i, call in enumerate(calls):
            try:
                status, value = call.get(timeout=max(0.0, bound - time.monotonic()))
            except multiprocessing.TimeoutError:
                status, value, stuck = "timeout", None, True
            if status == "ok":
                scores.append(
                    float(
                        as_scores(
                            value if isinstance(value, Sized) else [value],
                            1,
                            self.name,
                            {"completions": meta["completions"][i : i + 1]} if "completions" in meta else None,
                        )[0]
                    )
                )
                continue
            timeouts, errors = timeouts + (status == "timeout"), errors + (status == "error")
            if self.on_failure == "raise":
                self.close()
                what = f"it took longer than timeout_s={self.timeout_s} s" if status == "timeout" else value
                raise RewardError(failure_line(self.name, what, i, batch))
            scores.append(self.failure_score)
        if stuck:  # a worker is still busy with a call that ignored its timeout: start afresh next time
            self.close()
        self.last_metrics = {
            "reward/timeout_frac": torch.tensor(timeouts / max(n, 1)),
            "reward/error_frac": torch.tensor(errors / max(n, 1)),
        }
        return torch.tensor(scores, dtype=torch.float32, device=batch.response_ids.device)
