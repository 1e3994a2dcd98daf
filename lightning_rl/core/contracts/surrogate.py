"""The surrogate contract: log-probs with gradient in, an *unreduced* per-token loss (B, R) out (only the aggregator
reduces it), optionally weighted by a `Correction` for the sampler/trainer mismatch."""

from __future__ import annotations

from abc import ABC, abstractmethod

from torch import Tensor

from lightning_rl.core.batch import RolloutBatch


class Correction(ABC):
    """Per-token weights for the trainer/sampler mismatch (`components.surrogate.OffPolicyCorrection`): ``requires``
    names the batch fields read; ``__call__`` gives detached weights (B, R) and metrics."""

    requires: frozenset[str] = frozenset()

    @abstractmethod
    def __call__(self, batch: RolloutBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """Detached per-token weights (B, R) and metrics."""


class Surrogate(ABC):
    """``__call__(logprobs, batch) -> (per_token_loss (B, R), metrics)``; logprobs carry the gradient."""

    requires: frozenset[str] = frozenset({"advantages", "old_logprobs"})

    def __init__(self, correction: Correction | None = None):
        self.correction = correction
        if correction is not None:
            self.requires = self.requires | correction.requires

    @property
    def inert_on_policy(self) -> str | None:
        """A term of this surrogate that is exactly 0, value and gradient, when pi_theta = pi_old on every update (one
        epoch of one mini-batch), named for the warning a config then gets; None when every term acts on-policy."""
        return None

    @abstractmethod
    def per_token_loss(self, logprobs: Tensor, batch: RolloutBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """Unreduced loss before the off-policy correction. Shape: (B, R)."""

    def __call__(self, logprobs: Tensor, batch: RolloutBatch) -> tuple[Tensor, dict[str, Tensor]]:
        if logprobs.shape != batch.response_ids.shape:
            raise ValueError(
                f"{type(self).__name__}: logprobs {tuple(logprobs.shape)} must match response_ids {tuple(batch.response_ids.shape)}"
            )
        loss, metrics = self.per_token_loss(logprobs, batch)
        if self.correction is not None:
            weight, extra = self.correction(batch)
            loss = loss * weight
            metrics.update(extra)
        return loss, metrics
