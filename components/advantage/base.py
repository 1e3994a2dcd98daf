"""What advantage estimators share beside their contract (`lightning_rl.core.contracts.AdvantageEstimator`)."""

from __future__ import annotations

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.deprecation import moved

__getattr__ = moved(__name__, "lightning_rl.core.contracts.advantage", ("AdvantageEstimator", "Advantages", "Whiten"))


def reject_greedy_rows(batch: RolloutBatch, who: str) -> None:
    """Fail naming ``who`` when the batch holds greedy baseline rows (only ReMax reads them)."""
    if batch.is_greedy is not None and bool(batch.is_greedy.any()):
        raise ValueError(
            f"{who} got greedy baseline rows; they belong to components.advantage.ReMax (set greedy_baseline=false on the rollout)"
        )
