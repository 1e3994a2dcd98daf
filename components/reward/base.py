"""The reward contract: a `RolloutBatch` in (its ``columns`` hold each sample's text and data row), scores (B,) out."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch

RewardInputs = dict[str, list[Any]]
"""A batch's ``columns``, per-sample lists: ``prompts`` and ``completions`` (decoded text) plus every dataset column
(e.g. ``answer``); an agent's episodes add ``transcripts``."""


class Scores(NamedTuple):
    """What the loop takes from a reward for one batch."""

    total: Tensor  # (B,) the scores
    parts: dict[str, Tensor]  # name -> (B,): a Composite's unweighted parts ({} for a single reward)
    metrics: dict[str, Tensor]  # detached metrics of the call (e.g. reward/timeout_frac)


def columns(batch: RolloutBatch, who: str) -> RewardInputs:
    """The batch's per-sample columns, or an error naming ``who`` when the batch carries none."""
    if batch.columns is None:
        raise ValueError(
            f"{who} reads the batch's columns (completions, dataset columns), but this RolloutBatch has none: "
            "build it with columns={'completions': [...], ...}"
        )
    return batch.columns


def column(batch: RolloutBatch, key: str, who: str) -> list:
    """One per-sample column, or an error naming the column, ``who`` reads it and what the data provides."""
    values = columns(batch, who)
    if key not in values:
        raise KeyError(
            f"{who} reads the dataset column '{key}', which the data does not provide; columns: {sorted(values)}"
        )
    return values[key]


class Reward(ABC):
    """Scores whole responses. ``requires`` names the `RolloutBatch` fields read (checked at setup)."""

    requires: frozenset[str] = frozenset()
    last_metrics: dict[str, Tensor] = {}
    """Detached metrics of the last call (e.g. ``reward/timeout_frac``), logged with the iteration; replaced, never mutated."""

    def setup(self, tokenizer) -> None:
        """Called once the tokenizer exists."""

    def data_columns(self) -> frozenset[str]:
        """The dataset columns this reward reads (e.g. ExactMatch's ``answer_key``): checked against the data before
        any model loads."""
        return frozenset()

    @abstractmethod
    def __call__(self, batch: RolloutBatch) -> Tensor:
        """Shape: (B,) float."""

    def score(self, batch: RolloutBatch) -> Scores:
        """The scores checked (B finite numbers, else an error naming this reward and the sample), with their named
        parts and the call's metrics: what the loop reads."""
        total = as_scores(self(batch), batch.batch_size, self.name, batch.columns)
        return Scores(total, {}, dict(self.last_metrics))

    @property
    def name(self) -> str:
        return type(self).__name__


def as_scores(values: Any, batch_size: int, who: str, meta: RewardInputs | None = None) -> Tensor:
    """Turn a reward's output into a finite float tensor (B,), or fail naming the reward and the sample.

    Accepted: a list / tuple of numbers (Python, numpy or one-element tensors), a tensor or numpy array
    with B elements ((B,) or (B, 1))."""
    if type(values).__module__ == "numpy" and hasattr(values, "shape"):  # an array (or a numpy scalar: rejected below)
        values = (
            torch.from_numpy(values.reshape(-1) if values.ndim else values.reshape(1))
            if values.dtype.kind in "biuf"
            else values
        )
    if isinstance(values, Tensor):
        if values.numel() != batch_size:
            raise ValueError(
                f"reward {who} must return {batch_size} scores (one per sample), got a tensor or array of shape {tuple(values.shape)}"
            )
        values = values.detach().float().flatten().cpu().tolist()
    if not isinstance(values, (list, tuple)) or len(values) != batch_size:
        got = f"{type(values).__name__} of length {len(values)}" if hasattr(values, "__len__") else repr(values)
        raise ValueError(f"reward {who} must return {batch_size} scores (one per sample), got {got}")
    values = [_number(v) for v in values]
    for i, v in enumerate(values):
        bad = v is None or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v))
        if bad:
            completion = f" for completion {meta['completions'][i]!r}" if meta and "completions" in meta else ""
            raise ValueError(
                f"reward {who} returned {v!r} at sample {i}{completion}; every score must be a finite number"
            )
    return torch.tensor([float(v) for v in values], dtype=torch.float32)


def _number(value: Any) -> Any:
    """A numpy scalar or a one-element tensor as a Python number; anything else unchanged (and judged by the caller)."""
    if isinstance(value, Tensor) and value.numel() == 1:
        return value.item()
    if type(value).__module__ == "numpy" and getattr(value, "size", 0) == 1 and value.dtype.kind in "biuf":
        return value.item()
    return value
