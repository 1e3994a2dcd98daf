"""The group-filter contract: which samples of a batch train, and how many rollout rounds may refill it
(`components.dynamic_sampling.DynamicSampling`)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from torch import Tensor

from lightning_rl.core.batch import RolloutBatch


class GroupFilter(ABC):
    """Keeps the samples worth training on (e.g. groups whose rewards differ) and lets the loop sample more prompts,
    up to ``max_rounds`` rollout rounds per iteration, until the batch holds as many groups as it asked for."""

    max_rounds: int = 1
    requires: frozenset[str] = frozenset()
    """`RolloutBatch` fields read besides ``scores`` and ``group_ids``, which every scored batch has."""

    @abstractmethod
    def keep(self, batch: RolloutBatch) -> Tensor:
        """(B,) bool: the samples kept (a scored batch: ``scores``, ``group_ids``)."""
