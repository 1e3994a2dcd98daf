"""The loop's side of a rollout record (lightning_rl.callbacks.RecordRollouts, lightning_rl.rollouts): what training an
iteration's batch again needs, taken where it exists.

    collected   the collect phase is done: the random state the trainer's side starts from (torch's, CUDA's and the
                mini-batch shuffle's: dropout and the mini-batch order draw from them), the trained models' training
                flags (an in-process sampler switches the policy to eval mode and back), the collect phase's metrics,
                and which fields of the batch the rollout and the reward gave
    trained     the advantages are estimated: the batch as the update trains it, the policy version training it, the
                checksum of the weights before the update, PPO-ptx's text; handed to the background writer

The update itself is not recorded: from the same weights and these, it is the same computation.
"""

from __future__ import annotations

from dataclasses import fields

from torch import Tensor, nn

from lightning_rl.callbacks.record import RecordRollouts
from lightning_rl.checkpoint import LoopState
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.loop.metrics import WeightedMeans
from lightning_rl.rng import global_random_state
from lightning_rl.rollouts import RecordedIteration, weights_checksum
from lightning_rl.roster import training_modes


class IterationRecorder:
    """Builds each iteration's `RecordedIteration` for ``sink`` (a `RecordRollouts` callback of the Trainer)."""

    def __init__(self, sink: RecordRollouts, state: LoopState, rank: int, world_size: int):
        self.sink, self.state, self.rank, self.world_size = sink, state, rank, world_size
        self._random: dict[str, Tensor] = {}
        self._metrics: dict[str, dict[str, Tensor]] = {}
        self._collected: tuple[str, ...] = ()
        self._modes: Tensor | None = None

    def collected(self, batch: RolloutBatch, metrics: WeightedMeans, model: nn.Module) -> None:
        """At the end of the collect phase (the trainer's side of the iteration starts from here); ``model``: the
        module holding the trained models."""
        self._random = {**global_random_state(), "shuffle": self.state.shuffle.get_state()}
        self._modes = training_modes(model)
        # the sums are replaced, never changed in place, as values are added: copies of the dicts are a snapshot
        self._metrics = {
            "sums": dict(metrics.sums),
            "weights": dict(metrics.weights),
            "maxima": dict(metrics.maxima),
            "minima": dict(metrics.minima),
        }
        self._collected = tuple(f.name for f in fields(batch) if getattr(batch, f.name) is not None)

    def trained(
        self,
        iteration: int,
        batch: RolloutBatch,
        version: int,
        model: nn.Module,
        ptx_text: tuple[Tensor, Tensor] | None,
    ) -> None:
        """Once the batch is estimated, before the update: the record of ``iteration`` to the writer. ``model``: the
        module whose trained parameters the checksum covers."""
        inputs = {} if ptx_text is None else {"ptx_ids": ptx_text[0], "ptx_mask": ptx_text[1]}
        self.sink.record(
            RecordedIteration(
                iteration=iteration,
                batch=batch,
                collected=self._collected,
                version=version,
                rank=self.rank,
                world_size=self.world_size,
                random=self._random,
                metrics=self._metrics,
                inputs=inputs,
                weights=weights_checksum(model),
                modes=self._modes,
            )
        )
