"""`RolloutBatch`: the one data object every phase reads and the module writes back to.

Per-token fields are ``(B, R)`` aligned with ``response_ids``; per-sample fields are ``(B,)``.
Samples of one prompt are contiguous and share ``group_ids``. Every field but the response ones
is optional so a test can build a batch by keyword.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Iterable

import torch
from torch import Tensor

PER_SAMPLE = ("truncated", "group_ids", "scores", "sample_mask", "is_greedy", "versions")
PER_TOKEN = (
    "response_ids",
    "response_mask",
    "rollout_logprobs",
    "old_logprobs",
    "ref_logprobs",
    "values",
    "token_rewards",
    "advantages",
    "returns",
    "action_mask",
    "env_rewards",
    "token_versions",
)
PROMPT = ("prompt_ids", "prompt_mask")


@dataclass
class RolloutBatch:
    response_ids: Tensor  # (B, R) right-padded
    response_mask: Tensor  # (B, R) 1 on sampled tokens incl. the true EOS, 0 after it
    prompt_ids: Tensor | None = None  # (B, P) left-padded
    prompt_mask: Tensor | None = None  # (B, P)
    rollout_logprobs: Tensor | None = None  # (B, R) log-probs the sampler reported
    truncated: Tensor | None = None  # (B,) bool: hit max_new_tokens without EOS
    group_ids: Tensor | None = None  # (B,) long
    is_greedy: Tensor | None = None  # (B,) bool: greedy baseline rows (ReMax), never in the loss
    scores: Tensor | None = None  # (B,) sequence reward
    sample_mask: Tensor | None = None  # (B,) 1 where the sample counts in the loss
    old_logprobs: Tensor | None = None  # (B, R)
    ref_logprobs: Tensor | None = None  # (B, R)
    values: Tensor | None = None  # (B, R)
    token_rewards: Tensor | None = None  # (B, R)
    advantages: Tensor | None = None  # (B, R)
    returns: Tensor | None = None  # (B, R)
    action_mask: Tensor | None = None  # (B, R) 1 on tokens the model sampled, 0 on environment tokens (None = all sampled)
    env_rewards: Tensor | None = None  # (B, R) an environment's per-turn rewards, on the last token of each turn
    versions: Tensor | None = None  # (B,) long: the oldest policy version that sampled any of the sample's tokens
    token_versions: Tensor | None = None  # (B, R) long: the version that sampled each token (partial rollouts, agents)

    def __post_init__(self) -> None:
        if self.response_ids.dim() != 2 or self.response_mask.shape != self.response_ids.shape:
            raise ValueError(
                f"response_ids and response_mask must both be (B, R); got {tuple(self.response_ids.shape)} "
                f"and {tuple(self.response_mask.shape)}"
            )

    @property
    def batch_size(self) -> int:
        return self.response_ids.shape[0]

    @property
    def action_tokens(self) -> Tensor:
        """(B, R) float: the tokens the model sampled. ``response_mask`` also covers environment tokens (tool
        results in a multi-turn transcript), which later turns attend to but which are never trained on."""
        mask = self.response_mask.float()
        return mask if self.action_mask is None else mask * self.action_mask.float()

    @property
    def loss_mask(self) -> Tensor:
        """(B, R) float: tokens that count in the loss (sampled response tokens of samples that count)."""
        mask = self.action_tokens
        if self.sample_mask is not None:
            mask = mask * self.sample_mask.float().unsqueeze(-1)
        return mask

    @property
    def counted(self) -> Tensor:
        """(B,) float: 1 for samples that count (sample_mask, and not a greedy baseline row), else 0.
        Per-sample means (sequence KL, the KL controller's input) divide by its sum, not by B."""
        counted = torch.ones(self.batch_size, device=self.response_ids.device) if self.sample_mask is None else self.sample_mask.float()
        if self.is_greedy is not None:
            counted = counted * (self.is_greedy == 0).float()
        return counted

    @property
    def response_lengths(self) -> Tensor:
        """(B,) the length of each response row, environment tokens included (what a decode reads)."""
        return self.response_mask.sum(-1)

    def replace(self, **changes) -> "RolloutBatch":
        return dataclasses.replace(self, **changes)

    def tensors(self) -> dict[str, Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), Tensor)}

    def to(self, device: torch.device | str) -> "RolloutBatch":
        return self.replace(**{k: v.to(device) for k, v in self.tensors().items()})

    def select(self, index: Tensor | slice) -> "RolloutBatch":
        """Rows ``index`` of every field (a slice, long indices or a (B,) bool mask)."""
        return self.replace(**{k: v[index] for k, v in self.tensors().items()})

    def split(self, size: int) -> list["RolloutBatch"]:
        """Contiguous chunks of at most ``size`` samples (micro-batches)."""
        return [self.select(slice(i, i + size)) for i in range(0, self.batch_size, size)]

    @classmethod
    def cat(cls, batches: Iterable["RolloutBatch"]) -> "RolloutBatch":
        """Concatenate along B, right-padding per-token fields and left-padding the prompt."""
        batches = list(batches)
        if len(batches) == 1:
            return batches[0]
        merged = {}
        for f in fields(cls):
            values = [getattr(b, f.name) for b in batches]
            if all(v is None for v in values):
                continue
            if any(v is None for v in values):
                raise ValueError(f"cannot concatenate batches where only some have `{f.name}`")
            if f.name in PER_TOKEN:
                width = max(v.shape[1] for v in values)
                values = [torch.nn.functional.pad(v, (0, width - v.shape[1])) for v in values]
            elif f.name in PROMPT:
                width = max(v.shape[1] for v in values)
                values = [torch.nn.functional.pad(v, (width - v.shape[1], 0)) for v in values]
            merged[f.name] = torch.cat(values)
        return cls(**merged)

    def require(self, names: Iterable[str], who: str) -> None:
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise ValueError(f"{who} needs RolloutBatch field(s) {missing}, which are not set")


def terminal_rewards(scores: Tensor, mask: Tensor) -> Tensor:
    """Place each sequence score on its last valid response token. Shape: (B,) -> (B, R).

    ``mask`` is ``response_mask``, or a batch's ``action_tokens`` (a multi-turn transcript is rewarded on the
    model's last token, never on an observation). Reading the reward at padding instead of the true last token
    is a classic RLHF bug (N+ implementation details, Huang et al. 2024); samples with no valid token get nothing.
    """
    valid = mask != 0
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    last = torch.where(valid, positions, -1).amax(-1) if mask.shape[-1] else torch.full(mask.shape[:1], -1, device=mask.device)  # (B,)
    rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = (last >= 0).nonzero().squeeze(-1)
    rewards[rows, last[rows]] = scores[rows].float()
    return rewards
