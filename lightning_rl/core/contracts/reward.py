"""The reward contract: a `RolloutBatch` in (its ``columns`` hold each sample's text and data row), scores (B,) out."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sized
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator, Literal, NamedTuple

import numpy as np
import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.errors import RewardError

RewardInputs = dict[str, list[Any]]
"""A batch's ``columns``, per-sample lists: ``prompts`` and ``completions`` (decoded text) plus every dataset column
under its ``data.columns`` name (e.g. ``prompt``, ``answer``); an agent's episodes add ``transcripts`` (and an
`OpenAIAgent`'s ``result`` and ``agent_error``)."""

ROLLOUT_COLUMNS = frozenset({"prompts", "completions", "transcripts", "result", "agent_error"})
"""The columns the loop and the agents add to every row beside the data's own (never read from the data)."""

OnFailure = Literal["raise", "score"]


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


_RAW = ContextVar("raw_scores", default=False)


@contextmanager
def raw_scores() -> Iterator[None]:
    """Within this context every score normaliser (`components.reward.Shaped`, `RewardModel`), however deeply nested in other rewards,
    returns its raw scores and leaves its statistics alone: what validation reports (pass@k counts a score >= 1 as
    solved, which a normalised score says nothing about), whatever the training shaping."""
    token = _RAW.set(True)
    try:
        yield
    finally:
        _RAW.reset(token)


def scoring_raw() -> bool:
    """Whether a reward is called within `raw_scores`: a shaping reward then returns its inner reward's scores."""
    return _RAW.get()


class Reward(ABC):
    """Scores whole responses. ``requires`` names the `RolloutBatch` fields read (checked at setup).

    A reward that reads rows takes ``on_failure`` and ``failure_score`` (`__init__`): when scoring a batch raises, the
    rows are scored again one at a time to find those that raise; ``raise`` stops with a `RewardError` naming the
    first, ``score`` gives each ``failure_score`` and counts them in ``reward/error_frac``."""

    requires: frozenset[str] = frozenset()
    last_metrics: dict[str, Tensor] = {}
    """Detached metrics of the last call (e.g. ``reward/timeout_frac``), logged with the iteration; replaced, never mutated."""
    on_failure: OnFailure = "raise"
    failure_score: float = 0.0

    def __init__(self, on_failure: OnFailure = "raise", failure_score: float = 0.0):
        """
        Args:
            on_failure: a row whose reward raises (or is not a finite number): ``raise`` stops the run naming the row;
                ``score`` gives it ``failure_score`` and counts it in ``reward/error_frac``.
            failure_score: the score of such a row with ``on_failure: score``.
        """
        if on_failure not in ("raise", "score"):
            raise ValueError(f"{type(self).__name__}: on_failure must be raise or score, got {on_failure!r}")
        self.on_failure, self.failure_score = on_failure, float(failure_score)

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
        """The scores checked (B finite numbers), with their named parts and the call's metrics: what the loop reads.
        A call that raises is made again row by row (`on_failure`); ``reward/error_frac`` is logged with
        ``on_failure: score``."""
        counted = {"reward/error_frac": torch.tensor(0.0)} if self.on_failure == "score" else {}
        try:
            total = as_scores(self(batch), batch.batch_size, self.name, batch.columns)
        except RewardError:  # a wrapped reward's, already named
            raise
        except TimeoutError as err:  # the whole call timed out: row by row would wait as long again for each row
            if self.on_failure == "raise":
                raise RewardError(
                    f"{err}; or set on_failure: score on this reward to score such a batch failure_score"
                ) from err
            total = torch.full((batch.batch_size,), self.failure_score)
            return Scores(total, {}, {**counted, "reward/timeout_frac": torch.tensor(1.0)})
        except Exception as err:
            return self._score_row_by_row(batch, err, counted)
        return Scores(total, {}, {**counted, **self.last_metrics})

    def _score_row_by_row(self, batch: RolloutBatch, err: Exception, counted: dict[str, Tensor]) -> Scores:
        """After the batch's call raised ``err``: each row scored alone, a row that raises (or is not one finite number)
        named (``raise``) or given ``failure_score`` (``score``). When no row fails alone, the batch's error is raised."""
        scores, failed = [], 0
        for i in range(batch.batch_size):
            row = batch.select(slice(i, i + 1))
            try:
                scores.append(float(as_scores(self(row), 1, self.name)[0]))
                continue
            except NotAScore as row_err:
                cause, cause_err = row_err.what, row_err
            except Exception as row_err:
                cause, cause_err = f"{type(row_err).__name__}: {row_err}", row_err
            if self.on_failure == "raise":
                raise RewardError(failure_line(self.name, cause, i, batch)) from cause_err
            scores.append(self.failure_score)
            failed += 1
        if not failed:
            said = (
                str(err) if str(err).startswith("reward ") else f"reward {self.name} raised {type(err).__name__}: {err}"
            )
            raise RewardError(f"{said} (on the batch of {batch.batch_size} rows; on no row alone)") from err
        metrics = {**self.last_metrics, **counted, "reward/error_frac": torch.tensor(failed / batch.batch_size)}
        return Scores(torch.tensor(scores, dtype=torch.float32), {}, metrics)

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def part_name(self) -> str:
        """Its name as a part of a `Composite` (the ``reward/<part>`` tag): one word, no punctuation."""
        return self.name

    @property
    def model_path(self) -> str | None:
        """The checkpoint of the learned reward model this reward scores with, itself or inside it (a part of a
        `Composite`, the reward a `Shaped` wraps): what a critic with ``init_from: reward_model`` starts from. None: it
        scores with no learned model."""
        return None


class NotAScore(ValueError):
    """A reward's output that is not B finite numbers; ``what`` says what it was, in a few words."""

    def __init__(self, message: str, what: str):
        super().__init__(message)
        self.what = what


def failure_line(who: str, cause: str, row: int, batch: RolloutBatch) -> str:
    """The one line for row ``row`` of ``batch`` on which reward ``who`` failed with ``cause``: the reward, the row (its
    prompt and completion), the cause and the option that scores such rows instead."""
    columns = batch.columns or {}
    shown = ", ".join(f"{key[:-1]} {columns[key][row]!r:.80}" for key in ("prompts", "completions") if key in columns)
    return (
        f"reward {who} failed at row {row} of {batch.batch_size}{f' ({shown})' if shown else ''}: {cause}; set "
        "on_failure: score on this reward (e.g. model.reward.init_args.on_failure) to give such rows its "
        "failure_score, counted in reward/error_frac, and go on"
    )


def as_scores(values: Any, batch_size: int, who: str, meta: RewardInputs | None = None) -> Tensor:
    """Turn a reward's output into a finite float tensor (B,), or fail naming the reward and the sample.

    Accepted: a list / tuple of numbers (Python, numpy or one-element tensors), a tensor or numpy array
    with B elements ((B,) or (B, 1))."""
    if isinstance(values, (np.ndarray, np.generic)):  # an array (or a numpy scalar: rejected below)
        values = (
            torch.from_numpy(values.reshape(-1) if values.ndim else values.reshape(1))
            if values.dtype.kind in "biuf"
            else values
        )
    if isinstance(values, Tensor):
        if values.numel() != batch_size:
            got = f"a tensor or array of shape {tuple(values.shape)}"
            raise NotAScore(
                f"reward {who} must return {batch_size} scores (one per sample), got {got}", f"it returned {got}"
            )
        values = values.detach().float().flatten().cpu().tolist()
    if not isinstance(values, (list, tuple)) or len(values) != batch_size:
        got = f"{type(values).__name__} of length {len(values)}" if isinstance(values, Sized) else repr(values)
        raise NotAScore(
            f"reward {who} must return {batch_size} scores (one per sample), got {got}", f"it returned {got}"
        )
    values = [_number(v) for v in values]
    for i, v in enumerate(values):
        bad = v is None or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v))
        if bad:
            completion = f" for completion {meta['completions'][i]!r}" if meta and "completions" in meta else ""
            raise NotAScore(
                f"reward {who} returned {v!r} at sample {i}{completion}; every score must be a finite number",
                f"it returned {v!r:.60}, not a finite number",
            )
    return torch.tensor([float(v) for v in values], dtype=torch.float32)


def _number(value: Any) -> Any:
    """A numpy scalar or a one-element tensor as a Python number; anything else unchanged (and judged by the caller)."""
    if isinstance(value, Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, (np.ndarray, np.generic)) and value.size == 1 and value.dtype.kind in "biuf":
        return value.item()
    return value
