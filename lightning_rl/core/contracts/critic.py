"""The critic contract: a trainable value function V(s_t) at every response token (`components.critic.ValueCritic`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

from torch import Tensor, nn

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.config import OptimizerConfig
from lightning_rl.core.lora import LoraSpec


class Critic(nn.Module, ABC):
    """A backbone and a scalar value head, built once the policy exists (`build`), trained by its own optimizer. The
    roster checkpoints, shards and exports it through ``backbone`` and ``head``; ``init_from`` / ``path`` / ``dtype``
    / ``lora`` say how it was built, so an export can build it again."""

    requires: frozenset[str] = frozenset({"returns", "values"})
    init_from: Literal["policy", "reward_model", "path"]
    path: str | None
    dtype: Literal["float32", "bfloat16", "float16"]
    lora: LoraSpec | None
    optimizer: OptimizerConfig
    pretrain_steps: int
    """RL iterations at the start during which only the critic learns (value pretraining)."""
    backbone: nn.Module | None
    head: nn.Module | None

    @abstractmethod
    def build(self, policy_path: str, reward_model_path: str | None = None, policy: nn.Module | None = None) -> None:
        """Load the backbone and create the head once (idempotent)."""

    @abstractmethod
    def forward(self, batch: RolloutBatch, packed: bool = False) -> Tensor:
        """V(s_t) for every response position, fp32; ``packed``: padding-free. Shape: (B, R)."""

    @abstractmethod
    def loss(self, values: Tensor, batch: RolloutBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """The value loss (a scalar, reduced over the tokens that count) and its detached metrics."""
