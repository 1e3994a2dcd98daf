"""`ServerRollout`: sampling on inference servers over HTTP (token ids in, token ids and log-probs out), the policy's
weights pushed to them after every update; the engine (`Engine`) is a subclass's choice.

An engine pins its own torch (and CUDA stack), so it runs out of process: servers already running (``servers.urls``,
or a router in front of them), or one launched here (``servers.launch``). Every optimize phase ends with
``sync_weights``, which pushes the policy as weight version v + 1 and checks it arrived; every batch carries the version
that sampled it, and an answer from any other version is an error rather than a silently stale sample.

Departures from `HFRollout`: the samples come with the sampler's own log-probs (``rollout_logprobs``, always), and an
EOS sampled exactly at ``max_new_tokens`` is not ``truncated`` (see `to_batch`). A prompt's images go with its token
ids (base64 PNG data URLs); the server computes their pixels with its own processor.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from lightning_rl.core.batch import Prompts, RolloutBatch
from lightning_rl.core.contracts import Rollout
from lightning_rl.core.sampling_params import SamplingParams

from ..base import configured_params
from .connection import Connection
from .engine import Engine
from .generation import sample
from .healing import Healing
from .push import Pusher
from .samples import Request, Sample, image_data, to_batch
from .served import check_served
from .settings import Servers, Verification, WeightPush


class ServerRollout(Rollout):
    """Sample ``group_size`` responses per prompt from inference servers; push the policy's weights after every update.

    ``rollout_logprobs`` are the sampler's own: the trainer/sampler mismatch is logged as ``rollout/logprob_diff_*``
    and TIS/MIS can correct for it.
    """

    _set_up = False  # setup(tokenizer) has run: the sampler knows its EOS and pad ids

    samples_in_process = False
    engine_type: ClassVar[type[Engine]]

    def __init__(
        self,
        group_size: int = 8,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stop_token_ids: list[int] | None = None,
        greedy_baseline: bool = False,
        ignore_eos: bool = False,
        return_routes: bool = False,
        servers: Servers = Servers(),
        weights: WeightPush = WeightPush(),
        verify: Verification = Verification(),
    ):
        """The servers, the weight push and its checks are one settings object each (``servers:``, ``weights:``,
        ``verify:`` in a config). The flat keys of earlier releases (``base_url``, ``weight_sync``, ``verify_every``
        ...) are translated by the command line for one release, with a warning naming the new key; in Python pass
        the settings objects.

        Args:
            group_size: responses sampled per prompt (G).
            max_new_tokens: length cap; a response that reaches it without EOS is ``truncated``.
            temperature: sampling temperature; 0 means greedy.
            top_p: nucleus sampling mass (1.0 = off).
            top_k: top-k sampling (0 = off).
            stop_token_ids: extra token ids that end a response, besides the tokenizer's EOS.
            greedy_baseline: also decode one greedy response per prompt, appended to its group and
                flagged ``is_greedy`` (the ReMax baseline); it never enters the loss.
            ignore_eos: the tokenizer's EOS does not end a response (the engine's ``ignore_eos``; benchmarks: every
                response ``max_new_tokens`` long unless a stop token ends it).
            return_routes: a mixture-of-experts policy: ask the servers for the experts each router chose for every
                token (``routed_experts``: routing replay, ``moe/route_agreement``); the server must run with
                ``--enable-return-routed-experts``.
            servers: where the servers are (``urls``) or how to start them (``launch``), and how requests to them
                behave (timeouts, retries, concurrency, restarts): `Servers`.
            weights: how the policy's weights reach the servers after every update (``weight_sync``: disk, tensor or
                distributed; LoRA adapters; colocated memory; partial rollouts): `WeightPush`.
            verify: how often and how closely each push is checked (the servers' checksums and a probe of
                log-probs): `Verification`.
        """
        who = type(self).__name__
        self.params = configured_params(
            who, group_size, max_new_tokens, temperature, top_p, top_k, stop_token_ids, greedy_baseline, ignore_eos
        )
        for settings in (servers, weights, verify):
            settings.check(who)
        self.return_routes = return_routes
        self.provides = (
            Rollout.provides
            | {"rollout_logprobs"}
            | ({"is_greedy", "sample_mask"} if greedy_baseline else set())
            | ({"routed_experts"} if return_routes else set())
        )
        self.connection = Connection(servers, self.engine_type)
        self.healing = Healing(self.connection, who)
        self.pusher = Pusher(weights, verify, self, f"lightning_rl_{who.lower()}_weights_")
        self._served_checked = False  # whether the connected servers were checked to serve the policy

    # ------------------------------------------------------------------ life
    def setup(self, tokenizer) -> None:
        """Read eos/pad, start the server if asked to, and check every server generates."""
        super().setup(tokenizer)
        self._set_up = True
        self.pusher.checks.tokenizer = tokenizer
        self.connection.default_model = tokenizer.name_or_path or None  # the policy's checkpoint
        if not self.connection.open:
            self._connect()

    def _connect(self) -> None:
        self._served_checked = False
        fresh = self.connection.connect(type(self).__name__, self.pusher.weights.release_memory)
        try:
            for url in self.connection.urls:  # before any request: a server that cannot give what the rollout needs
                self.connection.engine.check_setup(url, self.pusher.weights)
        except BaseException:
            self.connection.close()
            raise
        if fresh:
            self.pusher.forget_servers()
        self.pusher.engine = self.connection.engine
        self.pusher.urls = list(self.pusher.weights.weight_update_urls or self.connection.urls)

    def _connected(self, policy: nn.Module | None = None) -> None:
        """Connect again after ``close``; with the policy, check once per connection that every server serves it."""
        if not self.connection.open:
            if not self._set_up:
                raise RuntimeError(
                    f"{type(self).__name__}.setup(tokenizer) must run before generate/sync_weights "
                    "(RLModule.configure_model calls it)"
                )
            self._connect()  # used again after close() (e.g. trainer.validate after trainer.fit)
        if policy is not None and not self._served_checked:
            engine = self.connection.engine
            for url in self.connection.urls:  # before any request or push reaches them
                check_served(engine, url, policy, f"{self.connection.key}.servers.urls")
            self._served_checked = True

    def prepare(self, policy: nn.Module, max_staleness: int = 1) -> None:
        """Asynchronous training: connect and push the first weights here, on the trainer's thread; from now until
        ``close`` requests may be in flight during a push (no separate cache flush; partial rollouts interrupt them).
        A LoRA adapter push keeps the ``max_staleness + 1`` newest adapters loaded: requests in flight finish on theirs."""
        self.pusher.adapters.keep = max_staleness + 1
        self._connected(policy)
        if self.pusher.state.view().needs_sync and self.pusher.weights.sync_before_first_rollout:
            self.sync_weights(policy)
        self.pusher.overlapping = True

    def close(self) -> None:
        self.pusher.overlapping = False
        self.pusher.unload_adapters([u for u in self.pusher.urls if self.connection.launched_at(u) is None])
        self.connection.close()
        self.pusher.folders.close()

    # ------------------------------------------------------------------ weights
    def sync_weights(self, policy: nn.Module) -> None:
        """Push ``policy``'s weights to every server as ``weight_version + 1`` (rank 0 pushes, all ranks wait)."""
        self._connected(policy)
        while True:
            if self.healing.rejoin(wait=True):
                self._fresh_servers()
            try:
                self.pusher.sync(policy)  # a failed push is sent whole again, to every server
                return
            except Exception as failure:
                self.healing.recover(failure, may_heal=not self.pusher.overlapping)

    def _fresh_servers(self) -> None:
        """A restarted server joined: a new engine (no weight-transfer group of the old), and the next push is whole,
        with the current adapter, and verified, before anything samples."""
        self.connection.renew_engine()
        self.pusher.engine = self.connection.engine
        self.pusher.forget_servers()
        self.pusher.verify_next = True

    def stage_weights(self, policy: nn.Module):
        self._connected(policy)
        return self.pusher.stage(policy)

    @property
    def releases_memory(self) -> bool:
        return self.pusher.weights.release_memory

    @property
    def weight_version(self) -> int:
        """The last version every server holds (0: their launch weights)."""
        return self.pusher.state.version

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: Prompts, policy: nn.Module, params: SamplingParams | None = None) -> RolloutBatch:
        params = params or self.params
        self._connected(policy)
        n_prompts = len(prompts)
        # left padding stripped
        unpadded = [ids[mask.bool()].tolist() for ids, mask in zip(prompts.prompt_ids.cpu(), prompts.prompt_mask.cpu())]
        images = (
            [image_data(im) if im else None for im in prompts.images]
            if prompts.images is not None
            else [None] * n_prompts
        )
        jobs = [(p, params.samples_per_prompt, params.sampling_temperature, im) for p, im in zip(unpadded, images)]
        if params.with_baseline:
            jobs += [(p, 1, 0.0, im) for p, im in zip(unpadded, images)]
        while True:  # a server that dies or hangs is restarted and the whole rollout sampled again (never a part)
            try:
                version, answers = self._sample(jobs, policy, params)
                break
            except Exception as failure:
                self.healing.recover(failure, may_heal=not self.pusher.overlapping)
        groups = [answers[i] + (answers[n_prompts + i] if params.with_baseline else []) for i in range(n_prompts)]
        samples = [s for group in groups for s in group]  # prompt-major
        return to_batch(
            prompts,
            samples,
            params.rows_per_prompt,
            params.with_baseline,
            params.eos_ids(self.eos_token_id),
            self.pad_token_id,
            version,
            _experts_per_token(policy) if self.return_routes else None,
        )

    def _sample(self, jobs: list, policy: nn.Module, params: SamplingParams) -> tuple[int, list[list[Sample]]]:
        if not self.healing.live_urls():  # every server restarting: wait for them, then push them the policy
            self.healing.rejoin(wait=True)
            self._fresh_servers()
            self.sync_weights(policy)
        state = self.pusher.state.view()
        if (state.needs_sync and self.pusher.weights.sync_before_first_rollout) or (
            state.failed and not self.pusher.overlapping
        ):
            # after a failed push: the whole policy again, so no server samples from part of one
            self.sync_weights(policy)
        self.pusher.resume_memory()
        version = self.pusher.state.version  # read before the requests: a push may land while they run
        answers = self._run(jobs, version, params)
        self.pusher.release_memory()
        return version, answers

    def _run(
        self, jobs: list[tuple[list[int], int, float, list[str] | None]], version: int, params: SamplingParams
    ) -> list[list[Sample]]:
        """One request per job, spread round-robin over the servers, at most ``max_concurrency`` in flight."""
        engine, adapter = self.connection.engine, self.pusher.adapters.current
        # an adapter's name carries its version: the server's own weight version does not change on adapter loads
        check, partial = adapter is None, self.pusher.weights.partial_rollouts and self.pusher.overlapping
        requests = [
            Request(
                input_ids,
                n,
                temperature,
                params.top_p,
                params.top_k,
                params.max_new_tokens,
                list(params.stop_token_ids),
                images,
                params.ignore_eos,
                routes_from=0 if self.return_routes else None,
            )  # fmt: skip
            for input_ids, n, temperature, images in jobs
        ]
        return self.connection.map(  # never a partial batch: the first failure fails the rollout
            lambda url, request: sample(engine, url, request, version, adapter, partial, check),
            requests,
            self.healing.live_urls(),
            self.healing.watch,
        )

    def metrics(self) -> dict:
        return {"servers/restarts": torch.tensor(float(self.healing.restarts))}


def _experts_per_token(policy: nn.Module) -> int:
    from lightning_rl.core.moe import experts_per_token, is_moe

    if not is_moe(policy):
        raise ValueError(
            f"return_routes: the policy ({type(policy).__name__}) is not a mixture of experts; set return_routes: false"
        )
    return experts_per_token(policy)
