"""The sampling side: the weights a sampling client samples with (`Snapshot`), the models that hold them (`ModelPool`)
and the sampler that runs a batch of sample requests on a `Rollout`.

A snapshot is taken when a training client saves weights for a sampler (``save_weights_for_sampler``): its adapters
(LoRA) or all its weights (full), copied, so training on does not change what the sampler draws from (``kind:
inflight`` shares one snapshot per training client, updated by each later inflight save). Sampling runs on a pooled
model of the same base and LoRA shape with the snapshot's weights loaded into it (a few per shape, reused).

The sampler is the service's ``sampler`` rollout: by default `HFRollout` in this process; or a `ServerRollout`
(vLLM, SGLang) whose server is sent the snapshot's weights (`ServerRollout.sync_weights`: pushed as the adapter alone
or merged, then checked against this model's log-probs) before the first request that needs them. Prompt log-probs
(``compute_logprobs``, ``include_prompt_logprobs``) are computed here on the pooled model, whichever the sampler.
"""

from __future__ import annotations

import itertools
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from components.rollout.hf import HFRollout
from lightning_rl.core.batch import Prompts
from lightning_rl.core.contracts import Rollout
from lightning_rl.core.logprobs import sampled_logprobs
from lightning_rl.core.lora import LoraSpec
from lightning_rl.core.sampling_params import SamplingParams
from lightning_rl.service.codec import Sequence, encode_sample_response, sample_response_json
from lightning_rl.service.training import BaseModel

POOLED_PER_SHAPE = 2


@dataclass
class Snapshot:
    """Weights to sample with: ``tensors`` by parameter name (a LoRA model's adapters, or a full model's every
    weight), None for the base itself. ``version`` counts the updates of an inflight snapshot."""

    base: BaseModel
    spec: LoraSpec | None
    tensors: dict[str, Tensor] | None
    full: bool = False
    id: str = field(default_factory=lambda: secrets.token_hex(8))
    version: int = 0

    @property
    def shape(self) -> tuple:
        """Snapshots of one shape load into the same pooled models."""
        if self.tensors is None:
            return (self.base.path, "base")
        if self.full:
            return (self.base.path, "full")
        return (self.base.path, self.spec.rank, self.spec.alpha, tuple(self.spec.target_modules))

    def update(self, tensors: dict[str, Tensor]) -> None:
        self.tensors = tensors
        self.version += 1


class ModelPool:
    """A few models per snapshot shape, each remembering which snapshot (and version) it holds."""

    def __init__(self):
        self._models: dict[tuple, OrderedDict[int, tuple[nn.Module, tuple[str, int] | None]]] = {}
        self._ids = itertools.count()

    def module(self, snapshot: Snapshot) -> nn.Module:
        if snapshot.tensors is None:
            return snapshot.base.module
        models = self._models.setdefault(snapshot.shape, OrderedDict())
        wanted = (snapshot.id, snapshot.version)
        for key, (module, holds) in models.items():
            if holds == wanted:
                models.move_to_end(key)
                return module
        if len(models) < POOLED_PER_SHAPE:
            key, module = next(self._ids), snapshot.base.client_module(None if snapshot.full else snapshot.spec)
            module.requires_grad_(False)
        else:
            key, (module, _) = next(iter(models.items()))  # the least recently used
            del models[key]
        with torch.no_grad():
            params = dict(module.named_parameters())
            for name, tensor in snapshot.tensors.items():
                params[name].copy_(tensor)
        models[key] = (module, wanted)
        return module


@dataclass(frozen=True)
class SampleJob:
    """One sample request, as the sampler runs it."""

    prompt: list[int]
    num_samples: int
    params: SamplingParams
    seed: int | None
    prompt_logprobs: bool
    last_n: int | None
    sequence_ids: list[str]


@dataclass
class SampleAnswer:
    sequences: list[Sequence]
    prompt_logprobs: list[float | None] | None

    def json(self) -> dict:
        return sample_response_json(self.sequences, self.prompt_logprobs)

    def proto(self) -> bytes:
        return encode_sample_response(self.sequences, self.prompt_logprobs)


class Sampler:
    """Runs sample requests on a rollout: one per base model in this process, or the configured server's."""

    def __init__(self, server: Rollout | None, bases: list[BaseModel]):
        self.server, self.pool = server, ModelPool()
        self.rollouts: dict[str, Rollout] = {}
        for base in bases:
            rollout = server if server is not None else HFRollout(return_logprobs=True)
            rollout.setup(base.tokenizer)  # a server rollout starts (or connects to) its server here
            self.rollouts[base.path] = rollout
        self._on_server: tuple[str, int] | None = None  # the snapshot the server holds
        self.pushes = 0

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    def run(self, snapshot: Snapshot, jobs: list[SampleJob]) -> list[SampleAnswer]:
        """Jobs of one snapshot and one `SamplingParams` (a batch the scheduler grouped), in one ``generate``."""
        module = self.pool.module(snapshot)
        rollout = self.rollouts[snapshot.base.path]
        if self.server is not None and self._on_server != (snapshot.id, snapshot.version):
            rollout.sync_weights(module)  # pushed, then verified against this model's log-probs
            self._on_server = (snapshot.id, snapshot.version)
            self.pushes += 1
        params = jobs[0].params
        width = max(len(job.prompt) for job in jobs)
        ids = torch.full((len(jobs), width), snapshot.base.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(jobs), width, dtype=torch.long)
        for row, job in enumerate(jobs):  # left-padded, as the rollouts take prompts
            ids[row, width - len(job.prompt) :], mask[row, width - len(job.prompt) :] = torch.tensor(job.prompt), 1
        with torch.random.fork_rng(devices=[], enabled=jobs[0].seed is not None):
            if jobs[0].seed is not None:
                torch.manual_seed(jobs[0].seed)
            batch = rollout.generate(Prompts(ids, mask), module, params)
        lengths = batch.response_mask.sum(-1).tolist()
        answers = []
        for row, job in enumerate(jobs):
            rows = range(row * params.group_size, (row + 1) * params.group_size)
            sequences = [
                Sequence(
                    batch.response_ids[r, : lengths[r]].tolist(),
                    batch.rollout_logprobs[r, : lengths[r]].tolist(),
                    not bool(batch.truncated[r]),
                )
                for r in rows
            ]
            scored = prompt_logprobs(module, job.prompt, job.last_n) if job.prompt_logprobs else None
            answers.append(SampleAnswer(sequences, scored))
        return answers


@torch.no_grad()
def prompt_logprobs(module: nn.Module, prompt: list[int], last_n: int | None) -> list[float | None]:
    """log p(prompt[i] | prompt[:i]) for every position but the first (None there), or for the last ``last_n`` only."""
    ids = torch.tensor([prompt])
    logits = module(input_ids=ids, use_cache=False).logits[:, :-1]  # (1, n - 1, V)
    scored = sampled_logprobs(logits, ids[:, 1:])[0].tolist()  # (n - 1,)
    values: list[float | None] = [None, *scored]
    if last_n is not None:
        values[: len(values) - last_n] = [None] * (len(values) - last_n)
    return values
