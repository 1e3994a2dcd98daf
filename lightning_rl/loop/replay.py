"""The collect phase of ``lightning-rl replay``: each iteration's batch read from a rollout record
(lightning_rl.rollouts) instead of sampled, scored or run through an environment.

What a recorded iteration gives back, and why each is needed for the same parameters bit for bit:

- the batch as the collect phase gave it (tokens, masks, the sampler's log-probs, scores and their parts, versions,
  per-row data): the trainer computes the rest again (old and reference log-probs, values, advantages), as the run
  did, with whatever estimator and surrogate the replay's config names;
- torch's random state (and CUDA's) and the mini-batch shuffle's as the trainer's side began: sampling drew from the
  first in the run, and a replay samples nothing, so dropout would otherwise draw other numbers;
- the trained models' training flags then: an in-process sampler switches the policy to eval mode and back, which
  turns dropout (a LoRA adapter's) on or off for the update;
- the collect phase's metrics (rewards, staleness, dropped groups), logged again at the same iteration;
- PPO-ptx's pretraining text.

A batch trains at the iteration that recorded it, after the same updates, so the staleness it had in an asynchronous
run (the versions that sampled it against the version that trained it) holds in the replay too.

When the replay trains as the run did (``reproduces``), each iteration is checked against the record: the checksum of
the weights before its update, and every field the trainer computed again. The first difference is said once, with
where it is (`diverged`).
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import fields
from typing import Callable, Iterator

import torch
from torch import nn
from torch.utils.data import IterableDataset

from lightning_rl.checkpoint import LoopState
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.errors import ConfigError
from lightning_rl.core.ops import dist_ready
from lightning_rl.loop.metrics import WeightedMeans
from lightning_rl.rng import set_global_random_state
from lightning_rl.rollouts import Record, RecordedIteration, weights_checksum
from lightning_rl.roster import set_training_modes, training_modes


class Replay:
    """Recorded batches in place of `lightning_rl.loop.collect.Collector` (same ``collect`` / ``push`` / ``version``)."""

    def __init__(self, record: Record, state: LoopState, model: nn.Module, reproduces: bool = True):
        """``model``: the module holding the trained models; ``reproduces``: the replay trains with the recorded run's
        settings, so it is checked against the record."""
        self.record, self.state, self.model, self.reproduces = record, state, model, reproduces
        self.replayed = 0
        self.diverged: str | None = None
        """The first difference from the recorded run (None: none so far)."""
        self._current: RecordedIteration | None = None

    @property
    def version(self) -> int:
        """The policy version that trained the current batch in the recorded run."""
        return self._current.version

    def collect(
        self, next_prompts: Callable[[], dict], policy: nn.Module, metrics: WeightedMeans, device, iteration: int, *_
    ) -> tuple[RolloutBatch, dict]:
        """Iteration ``iteration + 1``'s batch as the collect phase gave it, with the random state and metrics it left."""
        next_prompts()  # Lightning's batch: a counter that keeps its progress (and a resumed replay's) in step
        rank, world = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if dist_ready() else (0, 1)
        if self.record.world_size != world:
            raise ConfigError(
                f"{self.record.folder} was recorded by {self.record.world_size} rank(s), each its own batches; this "
                f"replay runs {world}: set --trainer.devices (and --trainer.num_nodes) as the recorded run did"
            )
        try:
            recorded = self._current = self.record.read(iteration + 1, rank)
        except FileNotFoundError as missing:
            first = self.record.iterations[0]
            raise FileNotFoundError(
                f"{missing}: replay from the run's checkpoint of iteration {first - 1} (--ckpt_path)"
            ) from None
        set_global_random_state(recorded.random)
        self.state.shuffle.set_state(recorded.random["shuffle"])
        if recorded.modes is not None and (self.reproduces or len(recorded.modes) == len(training_modes(self.model))):
            set_training_modes(self.model, recorded.modes)  # models built otherwise than the run's keep their own
        for kind, named in recorded.metrics.items():  # the run's wall-clock times are not this replay's
            getattr(metrics, kind).update({k: v.to(device) for k, v in named.items() if not k.startswith("time/")})
        inputs = recorded.inputs
        data = {"ptx": {"ids": inputs["ptx_ids"], "mask": inputs["ptx_mask"]}} if "ptx_ids" in inputs else {}
        self.replayed += 1
        return recorded.rollout().to(device), data

    def check(self, batch: RolloutBatch, model: nn.Module) -> None:
        """Once the batch is estimated, before the update: the weights and what the trainer computed, against the
        record (said once, at the first difference)."""
        recorded = self._current
        if not self.reproduces or self.diverged is not None:
            return
        weights = weights_checksum(model)
        if recorded.weights is not None and not torch.equal(weights, recorded.weights):
            self._diverge(f"the weights before iteration {recorded.iteration}'s update differ from the recorded run's")
            return
        for f in fields(recorded.batch):
            theirs = getattr(recorded.batch, f.name)
            if f.name in recorded.collected or not isinstance(theirs, torch.Tensor):
                continue
            mine = getattr(batch, f.name)
            if mine is None or not torch.equal(mine.detach().cpu(), theirs):
                self._diverge(f"iteration {recorded.iteration}: {f.name} differs from the recorded run's")
                return

    def push(self, policy: nn.Module) -> None:
        """No sampler holds weights in a replay."""

    def _diverge(self, what: str) -> None:
        self.diverged = what
        warnings.warn(
            f"{what}: from here the replay no longer reproduces the run (a nondeterministic kernel, another device "
            "or thread count, or other starting weights)"
        )


class Ticks(IterableDataset):
    """A replay's data: 0, 1, 2, ... (Lightning's loop needs batches to count; the record holds the real ones)."""

    def __iter__(self) -> Iterator[int]:
        return itertools.count()
