"""`SamplingParams`: how a rollout samples, as one immutable value passed with each call.

A rollout is configured with its settings (``model.rollout.init_args``) and keeps them as ``rollout.params``;
whoever needs other settings for one call passes ``dataclasses.replace(rollout.params, ...)`` to ``generate``
(validation: greedy, or n samples at another temperature; an agent's later turns: one sample per context, its
stop tokens, the room left). Nothing changes a sampler's settings while a run goes on, so a sampler shared by the
trainer's thread and the asynchronous rollout thread is read the same by both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one ``generate`` call."""

    group_size: int = 8
    """Responses sampled per prompt (G)."""
    max_new_tokens: int = 64
    """Length cap; a response that reaches it without EOS is ``truncated``."""
    temperature: float = 1.0
    """Sampling temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end a response besides the tokenizer's EOS."""
    greedy: bool = False
    """One temperature-0 response per prompt (validation): ``group_size``, ``temperature`` and ``greedy_baseline`` are not used."""
    greedy_baseline: bool = False
    """Also decode one greedy response per prompt, appended to its group and flagged ``is_greedy`` (ReMax's baseline)."""
    ignore_eos: bool = False
    """The tokenizer's EOS does not end a response (it is sampled and counted like any token): every response runs to
    ``max_new_tokens`` unless one of ``stop_token_ids`` ends it. For benchmarks that need every sampler to generate
    the same number of tokens; a trained policy's EOS means the answer ended."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if self.group_size < 1 or self.max_new_tokens < 1:
            raise ValueError(f"group_size ({self.group_size}) and max_new_tokens ({self.max_new_tokens}) must be >= 1")
        if not (math.isfinite(self.temperature) and self.temperature >= 0) or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(
                f"need temperature >= 0, 0 < top_p <= 1 and top_k >= 0; got {self.temperature}, {self.top_p}, {self.top_k}"
            )

    @property
    def samples_per_prompt(self) -> int:
        """Sampled responses per prompt (1 when ``greedy``)."""
        return 1 if self.greedy else self.group_size

    @property
    def with_baseline(self) -> bool:
        """Whether a greedy baseline row follows each group."""
        return self.greedy_baseline and not self.greedy

    @property
    def rows_per_prompt(self) -> int:
        """Rows of the batch per prompt: the samples and the greedy baseline row."""
        return self.samples_per_prompt + int(self.with_baseline)

    @property
    def sampling_temperature(self) -> float:
        """The temperature the samples are drawn at (0 when ``greedy``)."""
        return 0.0 if self.greedy else self.temperature

    def eos_ids(self, eos_token_id: int) -> list[int]:
        """Every id that ends a response: the tokenizer's EOS (unless ``ignore_eos``) and the stop tokens."""
        return [*(() if self.ignore_eos else (eos_token_id,)), *self.stop_token_ids]
