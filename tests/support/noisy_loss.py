"""A loss term that draws from torch's global random stream in the update, as dropout does (importable by dotted path:
``--model.loss_terms+=tests.support.noisy_loss.RandomTokenNLL``)."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import LossTerm
from lightning_rl.core.forward_outputs import PolicyForward


class RandomTokenNLL(LossTerm):
    """-coef * log pi_theta on a random half of the tokens, drawn anew at every call (a stand-in for dropout in the
    update: the gradient depends on the random numbers drawn)."""

    def __init__(self, coef: float = 1.0):
        self.coef = coef

    def __call__(self, forward: PolicyForward, batch: RolloutBatch) -> Tensor:
        logprobs = forward.logprobs  # (B, R)
        kept = (torch.rand(logprobs.shape, device=logprobs.device) < 0.5).float()  # (B, R)
        return -self.coef * logprobs.float() * kept
