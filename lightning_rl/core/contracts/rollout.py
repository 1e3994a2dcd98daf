"""The rollout contract: prompts in, a `RolloutBatch` of sampled responses out, sampled as a `SamplingParams` says."""

from __future__ import annotations

from abc import ABC, abstractmethod

from torch import nn

from lightning_rl.core.batch import Prompts, RolloutBatch
from lightning_rl.core.sampling_params import SamplingParams


class Rollout(ABC):
    """Samples ``params.group_size`` responses per prompt.

    ``params`` holds the configured `SamplingParams` (built from the subclass's init arguments, never changed
    afterwards); a call with other settings passes its own. Subclasses set ``provides``: the `RolloutBatch` fields
    they fill, so components that need a field (``rollout_logprobs`` for TIS/MIS) are checked against it once at setup.
    """

    provides: frozenset[str] = frozenset(
        {"prompt_ids", "prompt_mask", "response_ids", "response_mask", "truncated", "group_ids"}
    )
    params: SamplingParams | None = None
    """The configured sampling settings (set by ``__init__``; None only on jsonargparse's lazy default before its first
    method call, whose settings are the defaults)."""
    truncated_logprobs: bool = True
    """Whether ``rollout_logprobs`` are renormalised over the tokens top-k / top-p kept, as the trainer's are (vLLM's
    processed log-probs, `HFRollout`); False where the engine reports them before the truncation (SGLang)."""
    samples_in_process: bool = True
    """True when ``generate`` samples from the policy module it is given; False for a sampler with weights of its own (a server)."""
    releases_memory: bool = False
    """True when the sampler gives its memory back between rollouts (a colocated server's ``weights.release_memory``): it
    cannot sample while the trainer trains, so asynchronous training refuses it."""
    weight_version: int = 0
    """The policy version the sampler holds: the number of ``sync_weights`` calls. Every batch stamps its samples
    with the version that produced them (``RolloutBatch.versions``), which bounds staleness in asynchronous training."""

    def setup(self, tokenizer) -> None:
        """Called once the tokenizer exists; reads the ids a sampler needs (eos, pad)."""
        self.eos_token_id = tokenizer.eos_token_id
        self.pad_token_id = tokenizer.pad_token_id

    @abstractmethod
    def generate(self, prompts: Prompts, policy: nn.Module, params: SamplingParams | None = None) -> RolloutBatch:
        """Shapes: prompts (P_n, P) left-padded -> a batch of B = P_n * ``params.rows_per_prompt`` rows, each prompt's
        rows contiguous, with the prompt's fields laid out over them (``prompts.per_row``).

        ``params`` (None = ``self.params``): ``greedy`` gives one temperature-0 response per prompt (validation).
        """

    def prepare(self, policy: nn.Module, max_staleness: int = 1) -> None:
        """Called on the trainer's thread before the first rollout of an asynchronous run (e.g. a first weight push);
        ``max_staleness``: how many versions older than the trainer's a sample may be (``loop.max_staleness``)."""

    def sync_weights(self, policy: nn.Module) -> None:
        """Make the sampler use ``policy``'s current weights (called after every optimize phase). An in-process
        sampler reads the weights it is given at each ``generate``; it only counts the version."""
        self.weight_version += 1

    def stage_weights(self, policy: nn.Module):
        """Asynchronous training: take ``policy``'s weights now and return the push of them for another thread to run
        while the trainer goes on, or None when the push must run on the trainer's thread (``sync_weights``)."""
        return None

    def close(self) -> None:
        """Release what the rollout started (servers, threads)."""

    def metrics(self) -> dict:
        """The rollout's own counters, logged every iteration (a server rollout: ``servers/restarts``)."""
        return {}
