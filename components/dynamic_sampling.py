"""Sampling policies that shape the batch before the loss sees it (they live beside the rollout)."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import GroupFilter
from lightning_rl.core.ops import group_view


class DynamicSampling(GroupFilter):
    """DAPO dynamic sampling (Yu et al. 2025, arXiv:2503.14476, eq. 11): keep only groups whose rewards are
    not all equal, and sample more prompts until the batch holds as many groups as it asked for.

    A group with identical rewards has zero advantage under any group baseline: it costs a
    forward and backward pass and teaches nothing. After ``max_rounds`` rounds the batch trains
    with what it has (the kept fraction is logged); with nothing kept, the step is skipped.

    DAPO filters on accuracy: with a `Composite` reward (e.g. correctness + overlong penalty), ``part`` names
    the part to filter on, so an all-wrong group scored [0, -0.25, -0.5, -1] (wrong, with different length
    penalties) is dropped, as it should be.
    """

    def __init__(self, max_rounds: int = 3, tol: float = 1e-6, part: str | None = None):
        """
        Args:
            max_rounds: rollout rounds per iteration at most (1 = filter without resampling).
            tol: rewards closer than this count as equal.
            part: the name of a `Composite` reward part to filter on (e.g. ExactMatch); None = the total score.
        """
        if max_rounds < 1:
            raise ValueError(f"DynamicSampling: max_rounds must be >= 1, got {max_rounds}")
        self.max_rounds, self.tol, self.part = max_rounds, tol, part

    def keep(self, batch: RolloutBatch) -> Tensor:
        """(B,) bool: samples whose group has a spread in the filtered score (the reward's part ``part`` from
        ``batch.score_parts``, or the total score). Greedy baseline rows follow their group."""
        batch.require(["scores", "group_ids"], "DynamicSampling")
        scores = batch.scores.float()
        if self.part is not None:
            parts = batch.score_parts
            if not parts or self.part not in parts:
                raise ValueError(
                    f"DynamicSampling(part={self.part!r}): the reward has no part named {self.part!r} (parts: {sorted(parts or {})}); "
                    "use a Composite reward with that name in `names`, or part: null to filter on the total score"
                )
            scores = parts[self.part].float().to(scores.device)
        if batch.is_greedy is not None:
            scores = torch.where(batch.is_greedy.bool(), torch.full_like(scores, float("nan")), scores)
        grouped = group_view(scores, batch.group_ids)  # (n_groups, G)
        sampled = torch.nan_to_num(grouped, nan=float("-inf")).amax(-1) - torch.nan_to_num(
            grouped, nan=float("inf")
        ).amin(-1)
        alive = sampled > self.tol  # (n_groups,)
        return alive.unsqueeze(-1).expand_as(grouped).reshape(-1)
