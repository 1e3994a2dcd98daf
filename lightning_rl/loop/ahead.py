"""Asynchronous training: the rollout of the next iteration(s) runs on a background thread while this one optimizes.

With ``loop.max_staleness`` = k > 0, `RolloutAhead` keeps k rounds of prompts requested ahead, in data order,
each sampled and scored as soon as the one before it is done. A round sampled by weight version v is trained by
a later version; `drop_stale` leaves out the groups older than k versions (counted, never trained on silently),
and the surrogate corrects the rest (`components.surrogate.DecoupledClip`: the clip against the trainer's weights
before this update, re-weighted by pi_prox / pi_behav).

The sampler never sees weights change under it: SGLang applies a push once the requests in flight are answered
(or interrupts them, with ``partial_rollouts``), and an in-process sampler (`HFRollout`) samples from its own
copy of the policy, refreshed between rounds. Only sampling runs on the thread; scoring stays on the trainer's (a
reward may keep state or run collectives). Validation waits for the rounds in flight (`drain`): it seeds torch's
random stream for its own samples, which an in-process round draws from too.

A checkpoint records the data position of the first round not yet trained: a resumed run samples those prompts
again, with its own weights, so no prompt is lost or trained twice.

A SIGTERM while the trainer waits for a round (one stuck in a tool call, say) ends the wait at once in a
single-process run (``stopped``): Lightning only looks at the signal at an iteration's end, which a round waiting
for every tool's timeout would put off for as long.
"""

from __future__ import annotations

import copy
import threading
import time
import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable

import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor, nn

from lightning_rl.core.batch import Prompts, RolloutBatch
from lightning_rl.core.contracts import Rollout
from lightning_rl.core.ops import masked_mean
from lightning_rl.data.prompts import PromptDataModule

Produce = Callable[[Prompts, nn.Module], tuple[RolloutBatch, dict]]
"""(prompts, sampler policy) -> (the sampled batch, the rollout's metrics)."""


@dataclass
class _Round:
    position: dict | None  # the data streams' position before these prompts
    data: dict  # the data module's batch: its prompts (and PPO-ptx text)
    future: Future


class RolloutAhead:
    """Rounds of (prompts, sampled batch) produced ``depth`` ahead of the one being trained, in data order."""

    def __init__(
        self,
        rollout: Rollout,
        produce: Produce,
        depth: int,
        data: PromptDataModule | None = None,
        stopped: Callable[[], bool] = lambda: False,
    ):
        """``data``: the data module; its ``state_dict`` before each round's prompts is where a resume starts.
        ``stopped``: whether the run was told to stop (a SIGTERM), asked while the trainer waits for a round."""
        self.rollout, self.produce, self.depth, self.stopped = rollout, produce, depth, stopped
        self.position = data.state_dict if data is not None else (lambda: None)
        init = _same_device_initializer()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rollout-ahead", initializer=init)
        self._pending: deque[_Round] = deque()  # requested, not yet taken
        self._requests = threading.Lock()  # a take requesting rounds, or close cancelling them (another thread)
        self._closing = False
        self._first_untrained: dict | None = None  # position of the first round taken by the iteration under way
        self._sampler: nn.Module | None = None  # an in-process sampler's own copy of the policy
        self._weights = threading.Lock()  # held by a round while it samples from that copy
        self._pusher = ThreadPoolExecutor(1, thread_name_prefix="weight-push", initializer=init)
        self._push: Future | None = (
            None  # the latest weight push running beside the trainer, which later rounds wait for
        )
        self.version = 0  # the trainer's weight version: pushes requested (a deferred push may still be running)
        self._started = False

    def start(self, policy: nn.Module) -> None:
        """On the trainer's thread, before the first round: a first push to a server, or the sampler's copy."""
        if self.rollout.samples_in_process:
            self._sampler = copy.deepcopy(policy).eval().requires_grad_(False)
        else:
            self.rollout.prepare(policy, self.depth)
        self.version = self.rollout.weight_version
        self._started = True

    def take(
        self, next_prompts: Callable[[], dict], policy: nn.Module, rounds_left: int | None = None
    ) -> tuple[dict, RolloutBatch, dict]:
        """The next round: (data batch, sampled batch, metrics). Requests rounds until ``depth`` are queued behind it, but
        never more than ``rounds_left``, the iterations the run has still to train (this one included; None = no end):
        each takes at least one round, so every round requested is trained. The first failure of a round is raised
        here, on the trainer's thread."""
        if not self._started:  # at the first iteration: every strategy has restored a checkpoint's weights by then
            self.start(policy)
        wanted = self.depth + 1 if rounds_left is None else max(1, min(self.depth + 1, rounds_left))
        with self._requests:  # a close on another thread lets no round start after it began
            while len(self._pending) < wanted and not self._closing:
                position = self.position()
                data = next_prompts()
                self._pending.append(
                    _Round(position, data, self._pool.submit(self._produce, data["prompts"], policy, self._push))
                )
            if not self._pending:
                raise RuntimeError("the rounds sampled ahead were closed before this iteration took one")
            round_ = self._pending.popleft()
        if self._first_untrained is None:
            self._first_untrained = round_.position
        while not wait([round_.future], timeout=0.2).done:
            self._raise_if_stopped("waiting for the next round of samples")
        batch, metrics = round_.future.result()  # a failed rollout (e.g. a dead server) raises here
        return round_.data, batch, metrics

    def drain(self) -> None:
        """Wait until no round is sampling (the queued ones are done); rounds are requested again only by `take`."""
        for round_ in self._pending:
            if round_.future.exception() is not None:
                break  # raised by the take that reaches it

    def _produce(self, prompts: Prompts, policy: nn.Module, push: Future | None) -> tuple[RolloutBatch, dict]:
        if push is not None:
            push.result()  # this round samples from the weights pushed before it was requested (a failed push fails it)
        start = time.perf_counter()
        if self._sampler is None:
            batch, metrics = self.produce(prompts, policy)  # the server holds the weights
        else:
            with self._weights:
                batch, metrics = self.produce(prompts, self._sampler)
        metrics = dict(metrics, **{"async/rollout_s": torch.tensor(time.perf_counter() - start)})
        return batch, metrics

    def push(self, policy: nn.Module) -> None:
        """The new weights to the sampler: a server's push overlaps the requests in flight (on one process it also
        runs beside the trainer, on a thread of its own); an in-process copy is refreshed between rounds."""
        self.version += 1
        if self._push is not None and self._push.done() and self._push.exception() is not None:
            raise self._push.exception()  # the previous push failed and no round has met it yet
        if self._sampler is None:
            push = self.rollout.stage_weights(policy)
            if push is None:
                self.rollout.sync_weights(policy)
            else:
                self._push = self._pusher.submit(push)
            return
        while not self._weights.acquire(timeout=0.2):  # held by the round sampling
            self._raise_if_stopped("waiting for the round sampling to hand over the sampler's weights")
        try:
            with torch.no_grad():
                for mine, theirs in zip(self._sampler.parameters(), policy.parameters()):
                    mine.copy_(theirs)
                self.rollout.sync_weights(self._sampler)
        finally:
            self._weights.release()

    def _raise_if_stopped(self, waiting: str) -> None:
        """Lightning's own SIGTERM exception, raised mid-iteration: the fault callbacks save the last completed
        iteration (or this one, once its update is done), then the run exits with status 143."""
        if self.stopped():
            raise SIGTERMException(f"stopped (SIGTERM) while {waiting}")

    def trained(self) -> None:
        """The iteration under way is done: its rounds will not be sampled again after a resume."""
        self._first_untrained = None

    @property
    def untrained_position(self) -> dict | None:
        """The data position a resumed run must start from: before the first round not yet trained."""
        if self._first_untrained is not None:
            return self._first_untrained
        return self._pending[0].position if self._pending else None

    def save_untrained_position(self, checkpoint: dict, data: Any) -> None:
        """Replace the data module's state in ``checkpoint`` (saved by Lightning before the module's hook) with the
        position of the first round not trained."""
        if self.untrained_position is not None and type(data).__qualname__ in checkpoint:
            checkpoint[type(data).__qualname__] = dict(self.untrained_position)

    def close(self, interrupt: Callable[[], None] | None = None) -> None:
        """Cancel the queued rounds, end the one sampling and wait for it and for the push under way (each bounded by
        the rollout's own deadlines): the rollout they use is closed next.

        ``interrupt`` (an agent's ``cancel``) ends the round sampling. The queued rounds go first, so that none starts
        once the interrupted one returns (a run that is interrupted would otherwise wait for a whole new round, its
        tools timing out call by call). It is called until the round has ended: a round that started an instant
        before has not yet told the agent what it samples, and one call would miss it."""
        with self._requests:
            self._closing = True
            for round_ in self._pending:
                round_.future.cancel()  # a round already sampling cannot be cancelled: the interrupt ends it
            self._pending = deque(r for r in self._pending if not r.future.cancelled())  # a take may still wait on it
        idle = self._pool.submit(lambda: None)  # one thread: done once the round sampling has returned
        while interrupt is not None and not idle.done():
            interrupt()
            wait([idle], timeout=0.2)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pusher.shutdown(wait=True)
        if self._push is not None and self._push.exception() is not None:
            warnings.warn(f"the last weight push to the sampler failed: {self._push.exception()}")


def _same_device_initializer():
    """The current CUDA device is per thread: the background threads use the trainer's."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    device = torch.cuda.current_device()
    return lambda: torch.cuda.set_device(device)


def drop_stale(batch: RolloutBatch, version: int, max_staleness: int) -> tuple[RolloutBatch, dict[str, Tensor]]:
    """Leave out every group with a sample more than ``max_staleness`` versions older than ``version`` (the weights
    about to be trained). Whole groups go, so a group baseline never mixes in a dropped sample's reward."""
    if batch.versions is None:
        raise ValueError(
            "asynchronous training needs the rollout to stamp RolloutBatch.versions (the policy version that "
            "sampled each sample); this rollout does not: set them in its generate, or use max_staleness: 0"
        )
    staleness = version - batch.versions  # (B,)
    too_old = staleness > max_staleness
    stale_groups = torch.unique(batch.group_ids[too_old])
    keep = ~torch.isin(batch.group_ids, stale_groups)  # (B,)
    counted = batch.counted * keep.float()
    metrics = {
        "async/staleness_mean": masked_mean(staleness.float(), counted),
        "async/staleness_max": (staleness * keep).max() if bool(keep.any()) else staleness.new_zeros(()),
        "async/dropped_frac": (~keep).float().mean()
        if batch.batch_size
        else staleness.new_zeros((), dtype=torch.float),
    }
    if bool(keep.all()):
        return batch, metrics
    return batch.select(keep), metrics


def check_asynchronous(rollout: Rollout, trainer: Any, agent: Any = None) -> None:
    """Configurations asynchronous training cannot run, named before the first round."""
    if agent is not None and trainer.world_size > 1:
        raise ValueError(
            "model.loop.max_staleness > 0 with model.agent on several ranks: the episodes' turns are a collective "
            "(every rank takes as many turns as the busiest), which cannot run beside the update; use one rank, or max_staleness: 0"
        )
    if rollout.releases_memory:
        raise ValueError(
            "model.loop.max_staleness > 0 overlaps sampling with training, but the rollout releases the servers' "
            "memory between rollouts (weights.release_memory: true): set weights.release_memory: false, or max_staleness: 0"
        )
    strategy = type(trainer.strategy).__name__
    if rollout.samples_in_process and strategy in ("FSDPStrategy", "ModelParallelStrategy", "DeepSpeedStrategy"):
        raise ValueError(
            f"model.loop.max_staleness > 0 with an in-process sampler needs a full copy of the policy, which {strategy} "
            "shards: sample on SGLang servers (configs/rollout/sglang.yaml), or set max_staleness: 0"
        )
