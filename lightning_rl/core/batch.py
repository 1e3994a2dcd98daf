"""`RolloutBatch`: the one data object every phase reads and the module writes back to; `Prompts`, what the data gives.

Per-token fields are ``(B, R)`` aligned with ``response_ids``; per-sample fields are ``(B,)``; per-row fields
(``columns``: the data row and decoded texts; ``score_parts``: a reward's named parts) hold one entry per sample.
Samples of one prompt are contiguous and share ``group_ids``. Every field but the response ones is optional so a
test can build a batch by keyword. ``select`` / ``split`` / ``cat`` / ``to`` carry every field, so whatever a sample
brings (a new model input, a recorded agent call) travels with it by being one more field: a tensor field is indexed
along B, and a list-valued field is per row (one entry per sample, e.g. a prompt's images and their processed
tensors), whatever it holds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Iterable

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
    "teacher_logprobs",
    "teacher_topk_ids",
    "teacher_topk_logprobs",
    "teacher_logits",
    "sampling_support",
    "routed_experts",
)
PROMPT = ("prompt_ids", "prompt_mask", "prompt_routed_experts")
ROUTES = ("routed_experts", "prompt_routed_experts")
"""A mixture-of-experts sampler's routes: the experts each router (layer) chose for each token the sampler fed its
model, (B, T, L, K) long, -1 where unknown (padding, a sampler that did not say): the trainer's own router decides
there. ``routed_experts[:, t]`` are response token t's (the last sampled token is never fed: -1);
``prompt_routed_experts`` the prompt's, left-padded like it."""
ROWS = ("columns", "score_parts")
"""Per-row fields that are not one tensor: ``columns`` (name -> a list, one value per sample), ``score_parts``
(name -> a (B,) tensor). Any field whose value is a list is per row too, one entry per sample (``images``: a prompt's
images, PIL, for display and for servers that process images themselves; ``image_inputs``: the processor's tensors for
them, the policy's image inputs such as ``pixel_values`` and ``image_grid_thw``). The samples of one prompt share one
entry object, which ``to`` keeps shared."""

Columns = dict[str, list[Any]]
"""Per-row values by name, one list entry per row: the data row's columns, decoded prompts and completions."""


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
    action_mask: Tensor | None = (
        None  # (B, R) 1 on tokens the model sampled, 0 on environment tokens (None = all sampled)
    )
    env_rewards: Tensor | None = None  # (B, R) an environment's per-turn rewards, on the last token of each turn
    versions: Tensor | None = None  # (B,) long: the oldest policy version that sampled any of the sample's tokens
    token_versions: Tensor | None = None  # (B, R) long: the version that sampled each token (partial rollouts, agents)
    teacher_logprobs: Tensor | None = None  # (B, R) a teacher's log-probs of the sampled tokens (distillation)
    teacher_topk_ids: Tensor | None = None  # (B, R, K) long: the teacher's K most likely tokens at each position
    teacher_topk_logprobs: Tensor | None = None  # (B, R, K) their log-probs under the teacher
    teacher_logits: Tensor | None = None  # (b, r, V) a teacher's logits, set on a micro-batch of the update only
    # (B, R, K) long: the token ids the sampler kept at each position (vLLM's sampling_mask), -1 padded
    sampling_support: Tensor | None = None
    routed_experts: Tensor | None = (
        None  # (B, R, L, K) long: the experts the sampler's routers chose per response token
    )
    prompt_routed_experts: Tensor | None = None  # (B, P, L, K) long: the same for the prompt's tokens (-1: unknown)
    columns: Columns | None = None  # per row: the data row (prompt, answer, ...), prompts / completions / transcripts
    score_parts: dict[str, Tensor] | None = None  # name -> (B,): a Composite reward's unweighted parts
    images: list | None = None  # per row: the prompt's images (a list of PIL images; empty for a text-only prompt)
    image_inputs: list | None = (
        None  # per row: the processor's tensors for those images, {name: tensor}, concatenated along dim 0 over rows
    )

    def __post_init__(self) -> None:
        if self.response_ids.dim() != 2 or self.response_mask.shape != self.response_ids.shape:
            raise ValueError(
                f"response_ids and response_mask must both be (B, R); got {tuple(self.response_ids.shape)} "
                f"and {tuple(self.response_mask.shape)}"
            )
        for name, value in self.per_row_lists().items():
            if len(value) != self.batch_size:
                raise ValueError(f"{name} has {len(value)} entries for {self.batch_size} rows (one per row)")

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
        counted = (
            torch.ones(self.batch_size, device=self.response_ids.device)
            if self.sample_mask is None
            else self.sample_mask.float()
        )
        if self.is_greedy is not None:
            counted = counted * (self.is_greedy == 0).float()
        return counted

    @property
    def response_lengths(self) -> Tensor:
        """(B,) the length of each response row, environment tokens included (what a decode reads)."""
        return self.response_mask.sum(-1)

    def replace(self, **changes) -> "RolloutBatch":
        return dataclasses.replace(self, **changes)

    def with_columns(self, **values: list[Any]) -> "RolloutBatch":
        """The batch with these per-row columns added (one value per row each)."""
        for name, value in values.items():
            if len(value) != self.batch_size:
                raise ValueError(f"column {name!r} has {len(value)} values for {self.batch_size} rows")
        return self.replace(columns={**(self.columns or {}), **values})

    def tensors(self) -> dict[str, Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), Tensor)}

    def per_row_lists(self) -> dict[str, list]:
        """The list-valued fields (per row: one entry per sample), by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), list)}

    def to(self, device: torch.device | str) -> "RolloutBatch":
        changes: dict[str, Any] = {k: v.to(device) for k, v in self.tensors().items()}
        if self.score_parts is not None:
            changes["score_parts"] = {k: v.to(device) for k, v in self.score_parts.items()}
        moved: dict[int, Any] = {}
        changes.update({k: [entries_to(entry, device, moved) for entry in v] for k, v in self.per_row_lists().items()})
        return self.replace(**changes)

    def select(self, index: Tensor | slice) -> "RolloutBatch":
        """Rows ``index`` of every field (a slice, long indices or a (B,) bool mask)."""
        changes: dict[str, Any] = {k: v[index] for k, v in self.tensors().items()}
        if self.columns is not None:
            rows = _row_indices(index, self.batch_size)
            changes["columns"] = {k: [v[i] for i in rows] for k, v in self.columns.items()}
        if self.score_parts is not None:
            changes["score_parts"] = {
                k: v[index.to(v.device) if isinstance(index, Tensor) else index] for k, v in self.score_parts.items()
            }
        lists = self.per_row_lists()
        if lists:
            rows = _row_indices(index, self.batch_size)
            changes.update({k: [v[i] for i in rows] for k, v in lists.items()})
        return self.replace(**changes)

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
            if f.name in ROWS:
                keys = list(values[0])
                if any(list(v) != keys for v in values):
                    raise ValueError(
                        f"cannot concatenate batches whose `{f.name}` have different names: {[sorted(v) for v in values]}"
                    )
                merged[f.name] = {k: _concat([v[k] for v in values]) for k in keys}
                continue
            if isinstance(values[0], list):  # per row
                merged[f.name] = [entry for v in values for entry in v]
                continue
            fill = -1 if f.name in ROUTES else 0  # a padded position's route is unknown
            if f.name == "sampling_support":  # (B, R, K): K differs between rollouts; -1 lists no token
                width, k = max(v.shape[1] for v in values), max(v.shape[2] for v in values)
                values = [
                    torch.nn.functional.pad(v, (0, k - v.shape[2], 0, width - v.shape[1]), value=-1) for v in values
                ]
            elif f.name in PER_TOKEN:  # (B, R) or (B, R, ...): padded along R
                width = max(v.shape[1] for v in values)
                values = [
                    torch.nn.functional.pad(v, (0, 0) * (v.dim() - 2) + (0, width - v.shape[1]), value=fill)
                    for v in values
                ]
            elif f.name in PROMPT:  # (B, P) or (B, P, ...): left-padded along P
                width = max(v.shape[1] for v in values)
                values = [
                    torch.nn.functional.pad(v, (0, 0) * (v.dim() - 2) + (width - v.shape[1], 0), value=fill)
                    for v in values
                ]
            merged[f.name] = torch.cat(values)
        return cls(**merged)

    def require(self, names: Iterable[str], who: str) -> None:
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise ValueError(f"{who} needs RolloutBatch field(s) {missing}, which are not set")


def _row_indices(index: Tensor | slice, size: int) -> list[int]:
    """Python row numbers of a row index: a slice, long indices or a (B,) bool mask."""
    if isinstance(index, slice):
        return list(range(size))[index]
    index = index.cpu()
    return index.nonzero().squeeze(-1).tolist() if index.dtype == torch.bool else index.reshape(-1).tolist()


def entries_to(entry: Any, device: torch.device | str, moved: dict[int, Any]) -> Any:
    """A per-row entry with its tensors (alone, or the values of a dict) on ``device``; an entry object shared by
    several rows (a prompt's, over its group) is moved once and stays shared."""
    key = id(entry)
    if key not in moved:
        if isinstance(entry, Tensor):
            moved[key] = entry.to(device)
        elif isinstance(entry, dict):
            moved[key] = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in entry.items()}
        else:
            moved[key] = entry
    return moved[key]


def _concat(parts: list) -> Any:
    return torch.cat(parts) if isinstance(parts[0], Tensor) else [x for part in parts for x in part]


@dataclass
class Prompts:
    """A batch of prompts as the data gives them: left-padded token ids and each prompt's data row.

    A rollout lays a prompt's fields out over its rows of the `RolloutBatch` with `per_row`, so every per-prompt
    field (the data row; a per-prompt model input such as its images) reaches the batch without the rollout knowing it."""

    prompt_ids: Tensor  # (P_n, P) left-padded
    prompt_mask: Tensor  # (P_n, P)
    columns: Columns = field(default_factory=dict)  # per prompt: the data row (prompt text, answer, ...)
    images: list | None = None  # per prompt: its images (PIL), None for text-only data
    image_inputs: list | None = None  # per prompt: the processor's tensors for its images, {name: tensor}

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    def rows(self) -> list[dict[str, Any]]:
        """One dict per prompt: its data row."""
        return (
            [dict(zip(self.columns, values)) for values in zip(*self.columns.values())]
            if self.columns
            else [{} for _ in range(len(self))]
        )

    def to(self, device: torch.device | str) -> "Prompts":
        changes: dict[str, Any] = {"prompt_ids": self.prompt_ids.to(device), "prompt_mask": self.prompt_mask.to(device)}
        moved: dict[int, Any] = {}
        for f in dataclasses.fields(self):
            values = getattr(self, f.name)
            if isinstance(values, list):
                changes[f.name] = [entries_to(entry, device, moved) for entry in values]
        return dataclasses.replace(self, **changes)

    def per_row(self, rows: int) -> dict[str, Any]:
        """The prompt fields of a `RolloutBatch` with ``rows`` consecutive rows per prompt. Shapes: (P_n, P) -> (P_n * rows, P).
        A prompt's rows share its entries of the per-row lists (its images), not copies of them."""
        laid = {
            "prompt_ids": self.prompt_ids.repeat_interleave(rows, dim=0),
            "prompt_mask": self.prompt_mask.repeat_interleave(rows, dim=0),
            "columns": {k: [v for v in values for _ in range(rows)] for k, values in self.columns.items()},
        }
        for f in dataclasses.fields(self):
            values = getattr(self, f.name)
            if isinstance(values, list):  # a per-prompt list (its images)
                laid[f.name] = [v for v in values for _ in range(rows)]
        return laid


def terminal_rewards(scores: Tensor, mask: Tensor) -> Tensor:
    """Place each sequence score on its last valid response token. Shape: (B,) -> (B, R).

    ``mask`` is ``response_mask``, or a batch's ``action_tokens`` (a multi-turn transcript is rewarded on the
    model's last token, never on an observation). Reading the reward at padding instead of the true last token
    is a classic RLHF bug (N+ implementation details, Huang et al. 2024); samples with no valid token get nothing.
    """
    valid = mask != 0
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    last = (
        torch.where(valid, positions, -1).amax(-1)
        if mask.shape[-1]
        else torch.full(mask.shape[:1], -1, device=mask.device)
    )  # (B,)
    rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = (last >= 0).nonzero().squeeze(-1)
    rewards[rows, last[rows]] = scores[rows].float()
    return rewards
