"""The agent contract: whole episodes (several model calls, the environment's or the agent's messages between them)
sampled through a token-in/token-out `Rollout`, each laid out as training rows of one `RolloutBatch`."""

from __future__ import annotations

from abc import ABC, abstractmethod

from torch import Tensor, nn

from lightning_rl.core.batch import Prompts, RolloutBatch
from lightning_rl.core.sampling_params import SamplingParams

from .rollout import Rollout


class Agent(ABC):
    """Episodes for ``model.agent``: MultiTurnRollout (our `Environment` protocol) or OpenAIAgent (a function written
    against an OpenAI client). The loop calls ``setup`` once, ``generate`` per round, ``cancel`` from another thread
    when a run stops while a round samples ahead, and ``close`` at teardown.

    A batch from ``generate`` carries the same fields whoever built it: the sampled ids with their log-probs and
    versions (``action_mask`` 1), the tokens added between calls (``action_mask`` 0: context, never trained on),
    ``group_ids`` by prompt and per-row ``columns`` with ``completions`` (what a reward judges) and ``transcripts``.
    """

    max_total_tokens: int | None
    """The most response tokens of one training row (the context-length check reads it); None = the policy's context
    less the row's prompt (the run says so once)."""

    @abstractmethod
    def setup(self, tokenizer, sampler: Rollout) -> None:
        """Called once the tokenizer and the sampler exist (before any model forward)."""

    @abstractmethod
    def generate(
        self, sampler: Rollout, prompts: Prompts, policy: nn.Module, params: SamplingParams | None = None
    ) -> tuple[RolloutBatch, dict[str, Tensor]]:
        """Episodes for ``prompts`` (``params.samples_per_prompt`` per prompt, each from its data row), sampled by
        ``sampler`` with ``params`` (None = its own); the batch and the episodes' detached metrics."""

    def cancel(self) -> None:
        """End the ``generate`` calls under way on other threads at once (their episodes end, flagged truncated)."""

    def close(self) -> None:
        """Release what the agent started (environments, servers, threads)."""
