"""Phase 1 of an RL iteration, collect: sample responses (or whole agent episodes) for a round of prompts and score
them with the reward; with dynamic sampling, more rounds until the batch holds enough informative groups.

Every sample leaves here as one row of a `RolloutBatch` carrying all there is to know about it: its tokens, its
data row and decoded texts (``columns``: what rewards, the samples table and validation read) and, once scored,
``scores`` and the reward's named parts (``score_parts``).
"""

from __future__ import annotations

import time
import warnings
from typing import Callable

import torch
from torch import Tensor, nn

from lightning_rl.core.batch import Prompts, RolloutBatch
from lightning_rl.core.config import LoopConfig
from lightning_rl.core.contracts import Agent, GroupFilter, Reward, Rollout
from lightning_rl.core.ops import all_reduce_sum, zero_variance_fraction
from lightning_rl.core.sampling_params import SamplingParams
from lightning_rl.loop.ahead import RolloutAhead, drop_stale
from lightning_rl.loop.metrics import WeightedMeans

NextPrompts = Callable[[], dict]
"""The data module's next batch: ``{"prompts": Prompts, "ptx": {...}?}``."""


class Collector:
    """Sampling and scoring for `RLModule`: the rollout (or an agent's episodes on it), the reward, dynamic sampling
    and, in asynchronous training, the rounds sampled ahead (``ahead``)."""

    def __init__(
        self,
        rollout: Rollout,
        reward: Reward,
        agent: Agent | None,
        sampling: GroupFilter | None,
        loop: LoopConfig,
        tokenizer,
    ):
        self.rollout, self.reward, self.agent, self.sampling, self.loop, self.tokenizer = (
            rollout,
            reward,
            agent,
            sampling,
            loop,
            tokenizer,
        )
        self.ahead: RolloutAhead | None = None

    @torch.no_grad()
    def sample(
        self, prompts: Prompts, policy: nn.Module, params: SamplingParams | None = None
    ) -> tuple[RolloutBatch, dict[str, Tensor]]:
        """Responses to ``prompts`` sampled with ``policy`` (the trainer's, or an asynchronous sampler's copy) and
        ``params`` (None = the rollout's own), with their texts in ``columns``; and the agent's metrics. Runs on the
        background thread in asynchronous training."""
        if self.agent is None:
            batch, metrics = self.rollout.generate(prompts, policy, params), {}
            batch = batch.with_columns(completions=self._decode(batch))
        else:
            batch, metrics = self.agent.generate(
                self.rollout, prompts, policy, params
            )  # whole episodes, with transcripts
        metrics = {**metrics, **self.rollout.metrics()}  # e.g. servers/restarts
        columns = batch.columns or {}
        if "prompts" not in columns:
            batch = batch.with_columns(
                prompts=columns["prompt"]
                if "prompt" in columns
                else self.tokenizer.batch_decode(batch.prompt_ids, skip_special_tokens=True)
            )
        return batch, metrics

    def _decode(self, batch: RolloutBatch) -> list[str]:
        lengths = batch.response_lengths.tolist()
        return self.tokenizer.batch_decode(
            [ids[:n] for ids, n in zip(batch.response_ids.tolist(), lengths)], skip_special_tokens=True
        )

    @torch.no_grad()
    def score(self, batch: RolloutBatch, reward: Reward | None = None) -> tuple[RolloutBatch, dict[str, Tensor]]:
        """``batch`` with ``scores`` and ``score_parts`` from ``reward`` (None = the training reward), and its metrics."""
        scored = (reward or self.reward).score(batch)
        device = batch.response_ids.device
        parts = {name: part.to(device) for name, part in scored.parts.items()} or None
        return batch.replace(scores=scored.total.to(device), score_parts=parts), scored.metrics

    def collect(
        self,
        next_prompts: NextPrompts,
        policy: nn.Module,
        metrics: WeightedMeans,
        device: torch.device,
        iteration: int,
        rounds_left: int | None = None,
    ) -> tuple[RolloutBatch, dict]:
        """The iteration's scored batch and its first round's data batch (which carries PPO-ptx's text); with dynamic
        sampling, informative groups kept over rounds until the batch is full. ``rounds_left``: the iterations the run
        has still to train, this one included (None = no end): asynchronous rounds are never requested past them."""
        kept, groups_seen, target, waited, first = [], 0, None, 0.0, None
        rounds = self.sampling.max_rounds if self.sampling is not None else 1
        for round_ in range(rounds):
            data, batch, extra, wait = self._next_round(next_prompts, policy, device, rounds_left)
            first = first or data
            waited += wait
            n_prompts = len(data["prompts"])
            batch = batch.replace(group_ids=batch.group_ids + groups_seen)
            metrics.add_all({k: v.to(device) for k, v in extra.items()})  # e.g. reward/timeout_frac, agent/turns_mean
            target = target or n_prompts
            groups_seen += n_prompts
            if self.sampling is None:
                metrics.add(
                    "time/rollout_wait_s", torch.tensor(waited)
                )  # the trainer idle on samples (all of the rollout when synchronous)
                return batch, first
            keep = self.sampling.keep(batch)
            metrics.add(
                "sampling/zero_var_groups", zero_variance_fraction(batch.scores, batch.group_ids, batch.is_greedy)
            )
            kept.append(batch.select(keep))
            n_kept = sum(int(torch.unique(b.group_ids).numel()) for b in kept)
            # every rank runs the same number of rounds: a collective inside generate or the reward must not hang
            if int(all_reduce_sum(torch.tensor(float(n_kept < target), device=device))) == 0:
                break
        batch = RolloutBatch.cat(kept)
        if n_kept == 0:
            warnings.warn(
                f"iteration {iteration}: dynamic sampling kept no group in {round_ + 1} round(s); skipping the update"
            )
        rows = batch.batch_size // max(1, n_kept) if n_kept else 0
        if n_kept > target:
            batch = batch.select(slice(0, target * rows))
        metrics.add("sampling/kept_frac", torch.tensor(min(n_kept, target) / target))
        metrics.add("sampling/rounds", torch.tensor(float(round_ + 1)))
        metrics.add("time/rollout_wait_s", torch.tensor(waited))
        return batch, first

    def _next_round(
        self, next_prompts: NextPrompts, policy: nn.Module, device: torch.device, rounds_left: int | None
    ) -> tuple[dict, RolloutBatch, dict, float]:
        """A data batch and its scored samples: sampled now, or (asynchronous) taken from the rounds sampled ahead,
        with the groups older than ``loop.max_staleness`` versions left out. Scoring runs here, on the trainer's
        thread: a reward may hold state or run collectives (running normalisation, a sharded reward model)."""
        start = time.perf_counter()
        if self.ahead is None:
            data = next_prompts()
            batch, extra = self.produce(data["prompts"], policy, device)
            staleness = {}
        else:
            data, batch, extra = self.ahead.take(next_prompts, policy, rounds_left)
            batch, staleness = drop_stale(batch.to(device), self.ahead.version, self.loop.max_staleness)
        waited = time.perf_counter() - start
        batch, scored = self.score(batch)
        return data, batch, {**extra, **staleness, **scored}, waited

    @property
    def version(self) -> int:
        """The policy version being trained: the weight pushes so far (the sampler's, or the rounds sampled ahead's)."""
        return self.ahead.version if self.ahead is not None else self.rollout.weight_version

    def push(self, policy: nn.Module) -> None:
        """The weights just updated to the sampler (to the rounds sampled ahead, in asynchronous training)."""
        if self.ahead is not None:
            self.ahead.push(policy)
        else:
            self.rollout.sync_weights(policy)

    @torch.no_grad()
    def produce(
        self, prompts: Prompts, policy: nn.Module, device: torch.device
    ) -> tuple[RolloutBatch, dict[str, Tensor]]:
        """One round's samples for training: every sample counts unless ``loop.mask_truncated`` leaves out those
        that hit the length cap. Runs on the background thread in asynchronous training."""
        batch, metrics = self.sample(prompts.to(device), policy)
        if batch.sample_mask is None:
            batch = batch.replace(sample_mask=torch.ones(batch.batch_size, device=device))
        if self.loop.mask_truncated:
            batch = batch.replace(sample_mask=batch.sample_mask * (batch.truncated == 0).float())
        return batch, metrics
