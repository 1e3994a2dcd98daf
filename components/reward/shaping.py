"""Score normalisation and clipping (Zheng et al. 2023, "Secrets of RLHF"), for a reward model or any reward.

    static:   r' = (r - mean) / std
    running:  r' = (r - mu) / sigma, with mu, sigma the running statistics of every score seen in
              training (this batch included; all data-parallel ranks; Chan et al.'s parallel merge);
              sigma = 1 while those scores have no spread, so before any score is seen r' = r
    clip:     r' <- clamp(r', -clip, clip)

Like batch norm, the running statistics update only in train mode (not during validation); they are
buffers (``running_count``, ``running_mean``, ``running_m2``), so checkpoints carry them. Inside
`raw_scores` (lightning_rl.core.contracts; validation) every shaping is skipped: scores are reported on the reward's own scale.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts.reward import Reward, Scores, scoring_raw
from lightning_rl.core.deprecation import moved
from lightning_rl.core.ops import all_reduce_sum

from .wrapper import RewardWrapper

__getattr__ = moved(__name__, "lightning_rl.core.contracts.reward", ("raw_scores",))

Normalize = Literal["none", "static", "running"]


class ScoreNormalizer(nn.Module):
    """The normalisation and clipping above, as a module with running-statistics buffers."""

    def __init__(self, normalize: Normalize = "none", mean: float = 0.0, std: float = 1.0, clip: float | None = None):
        super().__init__()
        who = type(self).__name__
        if normalize not in ("none", "static", "running"):
            raise ValueError(f"{who}: normalize must be none, static or running, got {normalize!r}")
        if std <= 0 or (clip is not None and clip <= 0):
            raise ValueError(f"{who}: need std > 0 and clip > 0 (or null); got std={std}, clip={clip}")
        self.normalize, self.mean, self.std, self.clip = normalize, mean, std, clip
        self.register_buffer("running_count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("running_mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("running_m2", torch.zeros((), dtype=torch.float64))

    def normalized(self, scores: Tensor) -> Tensor:
        """Apply the configured normalisation and clipping to raw scores (B,). When either is on, the raw scores'
        mean is kept as ``reward/raw_mean`` in ``last_metrics`` (``reward/mean`` is then the shaped reward)."""
        if scoring_raw():
            return scores
        if self.normalize != "none" or self.clip is not None:
            self.last_metrics = {"reward/raw_mean": scores.detach().float().mean()}
        if self.normalize == "static":
            scores = (scores - self.mean) / self.std
        elif self.normalize == "running":
            if self.training:
                self._update_running(scores)
            std = (self.running_m2 / self.running_count.clamp_min(1.0)).sqrt().float()
            # no spread yet (no score seen, e.g. the validation before the first iteration, or equal scores only): a std
            # clamped to a tiny floor would multiply the scores by up to 1e6
            sigma = torch.where(std > 1e-6, std, torch.ones_like(std))
            scores = (scores - self.running_mean.float()) / sigma
        if self.clip is not None:
            scores = scores.clamp(-self.clip, self.clip)
        return scores

    def _update_running(self, scores: Tensor) -> None:
        """Merge this batch's (n, mean, M2) into the running ones (Chan et al.), over all ranks."""
        x = scores.double()
        if self.running_count.device != x.device:
            self.to(x.device)
        n_b, total, squares = all_reduce_sum(
            torch.stack(
                [torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device), x.sum(), x.square().sum()]
            )
        )
        mean_b = total / n_b.clamp_min(1.0)
        m2_b = (squares - n_b * mean_b.square()).clamp_min(0.0)
        n = self.running_count + n_b
        delta = mean_b - self.running_mean
        self.running_mean += delta * n_b / n.clamp_min(1.0)
        self.running_m2 += m2_b + delta.square() * self.running_count * n_b / n.clamp_min(1.0)
        self.running_count.copy_(n)


class Shaped(ScoreNormalizer, RewardWrapper):
    """Any reward, normalised and clipped as in the module docstring (e.g. a verifier's or an LLM judge's
    scores on an arbitrary scale, or a Composite whose parts add up past the range the advantages expect)."""

    def __init__(
        self,
        reward: Reward,
        normalize: Normalize = "none",
        mean: float = 0.0,
        std: float = 1.0,
        clip: float | None = None,
    ):
        """
        Args:
            reward: the reward to shape (a class_path / init_args entry in YAML).
            normalize: none, static (``mean``, ``std``) or running statistics.
            mean: static normalisation: subtracted from every score.
            std: static normalisation: every score is divided by it.
            clip: clamp the (normalised) score to [-clip, clip]; None = no clipping.
        """
        super().__init__(normalize, mean, std, clip)
        self.reward = reward
        self.requires = reward.requires

    @torch.no_grad()
    def forward(self, batch: RolloutBatch) -> Tensor:
        return self.score(batch).total

    @torch.no_grad()
    def score(self, batch: RolloutBatch) -> Scores:
        inner = self.reward.score(batch)  # a shaped Composite keeps its parts, unshaped
        total = self.normalized(inner.total.to(batch.response_ids.device))  # (B,)
        return Scores(total, inner.parts, {**inner.metrics, **self.last_metrics})
