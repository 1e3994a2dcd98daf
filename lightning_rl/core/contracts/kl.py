"""The KL-penalty contract: the leash to the reference policy, in the reward or in the loss (`components.kl.KLRegularizer`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

from torch import Tensor, nn

from lightning_rl.core.batch import RolloutBatch


class KLPenalty(nn.Module, ABC):
    """A penalty on the divergence from the reference model. A module, so its state (an adaptive coefficient) is in
    the checkpoint. ``coef`` is beta, a float64 buffer; ``placement`` says where it acts: ``reward`` (a per-token
    penalty in the return, before advantages) or ``loss`` (a differentiated term beside the surrogate)."""

    coef: Tensor
    placement: Literal["loss", "reward"]
    target: float | None
    """The sequence KL an adaptive controller steers to (`update` each iteration); None: beta stays fixed."""
    refresh_every: int | None
    """Copy the policy into the reference every this many iterations (None = never): the reference is then state."""

    @property
    @abstractmethod
    def active(self) -> bool:
        """Whether the penalty does anything (a coefficient of 0 with no target needs no reference model)."""

    @property
    @abstractmethod
    def requires(self) -> frozenset[str]:
        """The `RolloutBatch` fields read (``ref_logprobs``, maybe ``old_logprobs``)."""

    @abstractmethod
    def refresh_due(self, iterations_done: int) -> bool:
        """True after the iteration that completes a multiple of ``refresh_every``."""

    @abstractmethod
    def reward_penalty(self, batch: RolloutBatch) -> Tensor:
        """The per-token penalty added to the rewards (zeros unless placed in the reward). No gradient. Shape: (B, R)."""

    @abstractmethod
    def loss_term(self, logprobs: Tensor, batch: RolloutBatch) -> Tensor:
        """The per-token term added to the loss (zeros unless placed in the loss). Differentiable. Shape: (B, R)."""

    @abstractmethod
    def clamped(self, logprobs: Tensor, batch: RolloutBatch) -> Tensor:
        """1 where the term at ``logprobs`` was clamped, else 0 (``kl/clamped_frac``). No gradient. Shape: (B, R)."""

    @abstractmethod
    def update(self, kl: Tensor | float, n: int) -> None:
        """One controller step from the observed mean sequence KL over ``n`` samples (nothing without ``target``)."""
