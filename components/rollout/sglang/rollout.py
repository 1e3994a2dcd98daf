"""`SGLangRollout`: sampling on SGLang servers over their native HTTP API (token ids in, token ids and log-probs out).

SGLang pins its own torch and CUDA stack, so it runs out of process: servers already running
(``base_url``, or an SGLang router), or one launched here (``launch``). Every optimize phase ends with
``sync_weights``, which pushes the policy as weight version v + 1; every batch carries the version that
sampled it, and an answer from any other version is an error rather than a silently stale sample.

Departures from `HFRollout`: the samples come with the sampler's own log-probs (``rollout_logprobs``,
always), and an EOS sampled exactly at ``max_new_tokens`` is not ``truncated`` (see `to_batch`). A prompt's images go
with its token ids (``image_data``, see `generation`); the server computes their pixels with its own processor.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from torch import nn

from lightning_rl.core.batch import Prompts, RolloutBatch
from lightning_rl.core.sampling import SamplingParams

from ..base import Rollout, configured_params
from .client import SGLangClient, wait_for_answers
from .generation import Sample, generate, image_data, sampling_params, to_batch
from .lifecycle import ServerConnection
from .server import LaunchedServer
from .sync import WeightSync, check_weight_options


class SGLangRollout(ServerConnection, WeightSync, Rollout):
    """Sample ``group_size`` responses per prompt from SGLang servers; push the policy's weights after every update.

    ``rollout_logprobs`` are the sampler's own: the trainer/sampler mismatch is logged as
    ``rollout/logprob_diff_*`` and TIS/MIS can correct for it.
    """

    samples_in_process = False

    def __init__(
        self,
        base_url: str | list[str] | None = None,
        launch: dict | None = None,
        launch_python: str | None = None,
        group_size: int = 8,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stop_token_ids: list[int] | None = None,
        greedy_baseline: bool = False,
        timeout_s: float = 600.0,
        max_retries: int = 3,
        backoff: float = 1.0,
        max_concurrency: int = 64,
        weight_sync: Literal["disk", "tensor", "distributed"] = "disk",
        weight_dir: str | None = None,
        weight_update_urls: list[str] | None = None,
        bucket_mb: float = 512,
        master_address: str | None = None,
        master_port: int | None = None,
        group_backend: Literal["nccl", "gloo"] | None = None,
        group_per_server: bool | None = None,
        verify_every: int = 1,
        verify_tolerance: float = 0.1,
        flush_cache: bool = True,
        release_memory: bool = False,
        sync_before_first_rollout: bool = True,
        launch_timeout_s: float = 900.0,
        lora_sync: Literal["adapter", "merged"] = "adapter",
        deadline_s: float = 1800.0,
        progress_every_s: float = 60.0,
        partial_rollouts: bool = False,
    ):
        """
        Args:
            base_url: running server(s) (``http://host:port``) or an SGLang router; prompts are spread over them.
            launch: instead of ``base_url``, start ``python -m sglang.launch_server`` with these arguments
                (``{model_path: ..., mem_fraction_static: 0.5}``; ``True`` = bare flag) and stop it on ``close``.
            launch_python: interpreter that has sglang installed (None = this one).
            group_size: responses sampled per prompt (G).
            max_new_tokens: length cap; a response that reaches it without EOS is ``truncated``.
            temperature: sampling temperature; 0 means greedy.
            top_p: nucleus sampling mass (1.0 = off).
            top_k: top-k sampling (0 = off).
            stop_token_ids: extra token ids that end a response, besides the tokenizer's EOS.
            greedy_baseline: also decode one greedy response per prompt, appended to its group and
                flagged ``is_greedy`` (the ReMax baseline); it never enters the loss.
            timeout_s: seconds to wait for one answer (a whole generate request or a weight update).
            max_retries: extra attempts after a timeout, a dropped connection, a 5xx or an aborted request.
            backoff: seconds before the first retry, doubled for each further one.
            max_concurrency: requests in flight at once, over all servers.
            weight_sync: ``disk`` (save safetensors to ``weight_dir``, the server loads them), ``tensor``
                (CUDA IPC: the server must share this host and GPU) or ``distributed`` (rank 0 and every server
                in process groups; each push is broadcast bucket by bucket: no folder, servers on any host).
            weight_dir: directory the servers can read, for ``disk`` (None = a temporary one, same host only).
            weight_update_urls: servers that receive weight updates (None = ``base_url``); list the
                workers here when ``base_url`` is a router.
            bucket_mb: size of one weight-update request (``tensor``, ``distributed``); with FSDP2 a ``distributed``
                push holds at most two buckets of full (gathered) tensors at a time.
            master_address: for ``distributed``, this host's address as the servers reach it (rank 0 hosts the
                group's rendezvous; None = the address on the route to the first server).
            master_port: for ``distributed``, the rendezvous port on ``master_address`` (None = a free one); with a
                group per server, server i's group meets at ``master_port + i``.
            group_backend: for ``distributed``, ``nccl`` or ``gloo`` (None = nccl when the policy is on a GPU).
            group_per_server: for ``distributed``, each server in a group of its own with rank 0, broadcast to all at
                once, instead of one group of all (None = per server with gloo, whose broadcast sends to the servers
                one after the other; one group with NCCL, which pipelines the broadcast through the servers).
            verify_every: after every N-th push, check each server holds the pushed weights: the log-probs of its
                greedy continuation of a fixed prompt against the trainer's (0 = never); a mismatch fails the iteration.
            verify_tolerance: largest mean |log-prob difference| on the probe that passes (an fp32 sampler ~1e-6, a
                bf16 one about rollout/logprob_diff_mean; set a few times that).
            flush_cache: ``POST /flush_cache`` after each update (the radix cache holds KV of the old weights).
            release_memory: release the servers' GPU memory between rollouts and resume it before the next
                (colocated training; the server needs ``--enable-memory-saver``).
            sync_before_first_rollout: push the policy's weights before the first rollout, so a server
                started from another checkpoint (or a resumed run) samples from the trained policy.
            launch_timeout_s: seconds to wait for a launched server to answer ``/health_generate``.
            lora_sync: for a LoRA policy, push the adapter alone (``adapter``: from memory, with
                ``/load_lora_adapter_from_tensors``; the server needs ``enable_lora``, ``max_lora_rank`` and
                ``lora_target_modules``) or the base with the adapters merged in (``merged``: as ``weight_sync``).
            deadline_s: seconds one rollout (every request of a batch, retries included) may take before it fails.
            progress_every_s: while a rollout is slower than this, log its progress (answered / pending) this often.
            partial_rollouts: asynchronous training (``loop.max_staleness`` > 0): a weight push interrupts the
                requests in flight (``abort_all_requests``), which then continue with the new weights; each token
                keeps the version that sampled it (``token_versions``) and its log-prob under that version, so
                the off-policy correction is per token. False: a push waits for the requests in flight, and
                every response comes from one version.
        """
        if (base_url is None) == (launch is None):
            raise ValueError(
                "SGLangRollout: set exactly one of base_url (running servers) or launch (server arguments)"
            )
        self.params = configured_params(
            "SGLangRollout", group_size, max_new_tokens, temperature, top_p, top_k, stop_token_ids, greedy_baseline
        )
        check_weight_options(weight_sync, lora_sync, group_backend, bucket_mb, verify_every, verify_tolerance)
        if deadline_s <= 0 or progress_every_s <= 0:
            raise ValueError(
                f"SGLangRollout: deadline_s ({deadline_s}) and progress_every_s ({progress_every_s}) must be > 0"
            )
        if max_retries < 0 or max_concurrency < 1:
            raise ValueError(
                f"SGLangRollout: max_retries ({max_retries}) must be >= 0 and max_concurrency ({max_concurrency}) >= 1"
            )
        self.urls = [u.rstrip("/") for u in ([base_url] if isinstance(base_url, str) else list(base_url or []))]
        self.launch, self.launch_python, self.launch_timeout_s = launch, launch_python, launch_timeout_s
        self.timeout_s, self.max_retries, self.backoff, self.max_concurrency = (
            timeout_s,
            max_retries,
            backoff,
            max_concurrency,
        )
        self.weight_sync, self.weight_dir = weight_sync, weight_dir
        self.weight_update_urls = [u.rstrip("/") for u in weight_update_urls] if weight_update_urls else None
        self.bucket_mb, self.flush_cache, self.release_memory = bucket_mb, flush_cache, release_memory
        self.master_address, self.master_port, self.group_backend = master_address, master_port, group_backend
        self.group_per_server = group_per_server
        self.verify_every, self.verify_tolerance = verify_every, verify_tolerance
        self._pushes = 0  # pushes started; every verify_every-th is verified
        self._push_failed = False  # the servers may hold part of a push: the next rollout pushes again first
        self.sync_before_first_rollout = sync_before_first_rollout
        self.lora_sync = lora_sync
        self.adapter_name: str | None = None  # the loaded LoRA adapter that samples (adapter sync)
        self._adapters: deque[str] = deque()  # adapters loaded on the servers, oldest first
        self._keep_adapters = 1  # max_staleness + 1 in asynchronous training: requests in flight finish on theirs
        self.deadline_s, self.progress_every_s = deadline_s, progress_every_s
        self.partial_rollouts = partial_rollouts
        self.overlapping = (
            False  # asynchronous training (from prepare to close): requests may be in flight during a push
        )
        self._staged = 0  # the last version saved by stage_weights
        self.provides = (
            Rollout.provides | {"rollout_logprobs"} | ({"is_greedy", "sample_mask"} if greedy_baseline else set())
        )
        self.weight_version = 0  # bumped by every sync; sent to the server and carried by every batch
        self.server: LaunchedServer | None = None
        self.client: SGLangClient | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._own_dir: str | None = None
        self._released = False
        self._needs_sync = True  # the servers hold the checkpoint they started from, not (yet) the policy's weights

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: Prompts, policy: nn.Module, params: SamplingParams | None = None) -> RolloutBatch:
        params = params or self.params
        self._connected()
        if (self._needs_sync and self.sync_before_first_rollout) or (self._push_failed and not self.overlapping):
            self.sync_weights(
                policy
            )  # after a failed push: the whole policy again, so no server samples from part of one
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
        self._resume_memory()
        version = self.weight_version  # read before the requests: a push may land while they run
        answers = self._run(jobs, version, params)
        self._release_memory()
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
        )

    def _run(
        self, jobs: list[tuple[list[int], int, float, list[str] | None]], version: int, params: SamplingParams
    ) -> list[list[Sample]]:
        """One request per job, spread round-robin over the servers, at most ``max_concurrency`` in flight."""
        futures = []
        # an adapter's name carries its version: the server's own weight_version does not change on adapter loads
        check, partial, adapter = (
            self.adapter_name is None,
            self.partial_rollouts and self.overlapping,
            self.adapter_name,
        )
        for i, (input_ids, n, temperature, images) in enumerate(jobs):
            request = sampling_params(
                n, temperature, params.top_p, params.top_k, params.max_new_tokens, list(params.stop_token_ids)
            )
            url = self.urls[i % len(self.urls)]
            futures.append(
                self._pool.submit(
                    generate, self.client, url, input_ids, request, version, adapter, partial, check, images
                )
            )
        try:  # never a partial batch: the first failure fails the rollout
            return wait_for_answers(futures, self.deadline_s, self.progress_every_s, self.urls)
        except BaseException:
            for f in futures:
                f.cancel()
            raise
