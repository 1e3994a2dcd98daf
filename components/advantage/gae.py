"""`GAE`: generalized advantage estimation from per-token rewards and a critic's values.

Decoupled lambdas (VC-PPO) and VAPO's length-adaptive lambda are options of the one recurrence.
Conventions and departures:

* Terminal state: V(s_{L}) = 0 after the last valid token L - 1, and the recursion stops there.
  ``response_mask`` is a prefix mask (valid tokens, then padding), as every rollout writes it;
  rewards and values at padding are ignored, so padding after the last valid token changes
  nothing. (A loop that masks the bootstrap with the *current* token's mask, as some textbook versions do,
  lets a nonzero value or reward in the padding leak into the last valid token.)
* VAPO's lambda = 1 - 1/(alpha * l) is negative for l < 1/alpha (20 tokens at alpha = 0.05); it
  is clamped to [0, 1] (the paper's responses are thousands of tokens long and never reach it).
* ``lam_critic=None`` uses the actor's lambda for the value targets (classic PPO, one lambda).
* Multi-turn transcripts (``action_mask``): the recursion runs over the model's tokens only. An
  observation is not a step: the value of the first token after a tool result bootstraps the last
  token of the turn before it, and an environment's reward on that token enters its delta.
  VAPO's length is the number of the model's tokens.
* All arithmetic in fp32. Returns are computed before the base class whitens the advantages.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import AdvantageEstimator, Advantages, Whiten
from lightning_rl.core.ops import reverse_scan, steps_first


class GAE(AdvantageEstimator):
    """GAE (Schulman et al. 2015, arXiv:1506.02438, eq. 16): A_t = sum_l (gamma lam)^l delta_{t+l},
    delta_t = r_t + gamma V(s_{t+1}) - V(s_t); value targets G_t = A_t(lam_critic) + V(s_t).

    * ``lam_critic`` decoupled from ``lam_actor``: VC-PPO (Yuan et al. 2025, arXiv:2503.01491) fits
      the critic to lam_critic = 1 (Monte-Carlo) targets while the policy uses lam_actor = 0.95.
    * ``lam_actor="adaptive"``: VAPO's length-adaptive GAE (Yue et al. 2025, arXiv:2504.05118),
      lam_i = 1 - 1 / (alpha * l_i) per sequence, l_i its number of valid response tokens.
    """

    requires = frozenset({"token_rewards", "values"})
    produces_returns = True

    def __init__(
        self,
        gamma: float = 1.0,
        lam_actor: float | Literal["adaptive"] = 0.95,
        lam_critic: float | None = None,
        alpha: float = 0.05,
        whiten: Whiten = "none",
        shift_mean: bool = True,
        clip: float | None = None,
    ):
        """
        Args:
            gamma: discount; 1.0 for language models (the episode is one finite response).
            lam_actor: GAE lambda of the policy's advantages in [0, 1], or ``adaptive`` for VAPO's
                per-sequence lambda = 1 - 1 / (alpha * length), clamped to [0, 1].
            lam_critic: lambda of the value targets (returns); 1.0 = Monte-Carlo returns (VC-PPO,
                VAPO); None = the same lambda as the actor (classic PPO).
            alpha: VAPO's length scale, used only with ``lam_actor="adaptive"``.
            whiten: see `AdvantageEstimator` (PPO-RLHF whitens per batch).
            shift_mean: see `AdvantageEstimator`.
            clip: see `AdvantageEstimator`.
        """
        super().__init__(whiten, shift_mean, clip)
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"GAE: gamma must be in [0, 1], got {gamma}")
        if lam_actor != "adaptive" and not (isinstance(lam_actor, (int, float)) and 0.0 <= lam_actor <= 1.0):
            raise ValueError(f"GAE: lam_actor must be a number in [0, 1] or 'adaptive', got {lam_actor!r}")
        if lam_critic is not None and not 0.0 <= lam_critic <= 1.0:
            raise ValueError(f"GAE: lam_critic must be in [0, 1] (or null for the actor's lambda), got {lam_critic}")
        if alpha <= 0:
            raise ValueError(f"GAE: alpha must be > 0, got {alpha}")
        self.gamma, self.lam_actor, self.lam_critic, self.alpha = gamma, lam_actor, lam_critic, alpha

    def actor_lambda(self, lengths: Tensor) -> Tensor:
        """Per-sequence lambda of the policy's advantages. Shape: (B,) -> (B,)."""
        if self.lam_actor == "adaptive":
            return (1.0 - 1.0 / (self.alpha * lengths.float()).clamp_min(1e-12)).clamp(0.0, 1.0)
        return torch.full(lengths.shape, float(self.lam_actor), device=lengths.device)

    def estimate(self, batch: RolloutBatch) -> Advantages:
        mask = batch.action_tokens  # (B, R)
        for name in ("token_rewards", "values"):
            if getattr(batch, name).shape != mask.shape:
                raise ValueError(
                    f"GAE: {name} has shape {tuple(getattr(batch, name).shape)}, expected (B, R) = {tuple(mask.shape)}"
                )
        lam = self.actor_lambda(mask.sum(-1))  # (B,)
        lam_critic = lam if self.lam_critic is None else torch.full_like(lam, self.lam_critic)
        rewards, values, steps = batch.token_rewards, batch.values, mask
        if batch.action_mask is not None:  # the model's tokens as a prefix: observations are not steps
            order = steps_first(mask)  # (B, R)
            rewards, values, steps = rewards.gather(-1, order), values.gather(-1, order), mask.gather(-1, order)
        both = gae(rewards, values, steps, self.gamma, torch.stack([lam, lam_critic]))  # (2, B, R)
        if batch.action_mask is not None:
            both = torch.empty_like(both).scatter_(-1, order.expand_as(both), both)
        returns = (both[1] + batch.values.float()) * mask
        return Advantages(both[0], returns)


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: Tensor) -> Tensor:
    """GAE advantages for every lambda row of ``lam`` in one chunked backward scan (`reverse_scan`).

    Shapes: rewards, values, mask (B, R); lam (K, B) -> (K, B, R), 0 on padding. The recurrence,
    vectorised over K and B:  A_t = delta_t + gamma lam m_{t+1} A_{t+1},  with
    delta_t = m_t (r_t + gamma m_{t+1} V_{t+1} - V_t)  and  m_R = 0 (the terminal state).
    """
    m = mask.float()
    r, v = rewards.float() * m, values.float() * m
    next_m = torch.nn.functional.pad(m[:, 1:], (0, 1))  # (B, R): m_{t+1}, 0 past the end
    next_v = torch.nn.functional.pad(v[:, 1:], (0, 1)) * next_m  # V(s_{t+1}), 0 at the terminal state
    delta = (r + gamma * next_v - v) * m  # (B, R)
    decay = gamma * lam.float().unsqueeze(-1) * next_m  # (K, B, R)
    return reverse_scan(delta, decay) * m
