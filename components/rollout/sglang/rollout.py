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

import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import torch.distributed as dist
from torch import Tensor, nn

from lightning_rl.core.batch import Prompts, RolloutBatch
from lightning_rl.core.sampling import SamplingParams

from ..base import Rollout
from .client import SGLangClient, wait_for_answers
from .generation import Sample, generate, image_data, sampling_params, to_batch
from .server import LaunchedServer
from .sync import WeightSync
from .weights import rank


class SGLangRollout(WeightSync, Rollout):
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
        weight_sync: Literal["disk", "tensor"] = "disk",
        weight_dir: str | None = None,
        weight_update_urls: list[str] | None = None,
        tensor_bucket_mb: int = 512,
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
            weight_sync: ``disk`` (save safetensors to ``weight_dir``, the server loads them) or ``tensor``
                (CUDA IPC: the server must share this host and GPU).
            weight_dir: directory the servers can read, for ``disk`` (None = a temporary one, same host only).
            weight_update_urls: servers that receive weight updates (None = ``base_url``); list the
                workers here when ``base_url`` is a router.
            tensor_bucket_mb: size of one ``update_weights_from_tensor`` request, for ``tensor``.
            flush_cache: ``POST /flush_cache`` after each update (the radix cache holds KV of the old weights).
            release_memory: release the servers' GPU memory between rollouts and resume it before the next
                (colocated training; the server needs ``--enable-memory-saver``).
            sync_before_first_rollout: push the policy's weights before the first rollout, so a server
                started from another checkpoint (or a resumed run) samples from the trained policy.
            launch_timeout_s: seconds to wait for a launched server to answer ``/health_generate``.
            lora_sync: for a LoRA policy, push the adapter alone (``adapter``: written to ``weight_dir`` and
                loaded with ``/load_lora_adapter``; the server needs ``enable_lora``, ``max_lora_rank`` and
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
            raise ValueError("SGLangRollout: set exactly one of base_url (running servers) or launch (server arguments)")
        try:
            self.params = SamplingParams(group_size, max_new_tokens, temperature, top_p, top_k, tuple(stop_token_ids or ()), False, greedy_baseline)
        except ValueError as err:
            raise ValueError(f"SGLangRollout: {err}") from None
        if weight_sync not in ("disk", "tensor"):
            raise ValueError(f"SGLangRollout: weight_sync must be 'disk' or 'tensor', got {weight_sync!r}")
        if lora_sync not in ("adapter", "merged"):
            raise ValueError(f"SGLangRollout: lora_sync must be 'adapter' or 'merged', got {lora_sync!r}")
        if deadline_s <= 0 or progress_every_s <= 0:
            raise ValueError(f"SGLangRollout: deadline_s ({deadline_s}) and progress_every_s ({progress_every_s}) must be > 0")
        if max_retries < 0 or max_concurrency < 1:
            raise ValueError(f"SGLangRollout: max_retries ({max_retries}) must be >= 0 and max_concurrency ({max_concurrency}) >= 1")
        self.urls = [u.rstrip("/") for u in ([base_url] if isinstance(base_url, str) else list(base_url or []))]
        self.launch, self.launch_python, self.launch_timeout_s = launch, launch_python, launch_timeout_s
        self.timeout_s, self.max_retries, self.backoff, self.max_concurrency = timeout_s, max_retries, backoff, max_concurrency
        self.weight_sync, self.weight_dir = weight_sync, weight_dir
        self.weight_update_urls = [u.rstrip("/") for u in weight_update_urls] if weight_update_urls else None
        self.tensor_bucket_mb, self.flush_cache, self.release_memory = tensor_bucket_mb, flush_cache, release_memory
        self.sync_before_first_rollout = sync_before_first_rollout
        self.lora_sync = lora_sync
        self.adapter_name: str | None = None  # the loaded LoRA adapter that samples (adapter sync)
        self.deadline_s, self.progress_every_s = deadline_s, progress_every_s
        self.partial_rollouts = partial_rollouts
        self.overlapping = False  # asynchronous training (from prepare to close): requests may be in flight during a push
        self._staged = 0  # the last version saved by stage_weights
        self.provides = Rollout.provides | {"rollout_logprobs"} | ({"is_greedy", "sample_mask"} if greedy_baseline else set())
        self.weight_version = 0  # bumped by every sync; sent to the server and carried by every batch
        self.server: LaunchedServer | None = None
        self.client: SGLangClient | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._own_dir: str | None = None
        self._released = False
        self._needs_sync = True  # the servers hold the checkpoint they started from, not (yet) the policy's weights

    # ------------------------------------------------------------------ lifecycle
    def setup(self, tokenizer) -> None:
        """Read eos/pad, start the server if asked to, and check every server answers ``/health_generate``."""
        super().setup(tokenizer)
        if self.client is None:
            self._connect()

    def _connect(self) -> None:
        if self.release_memory and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise ValueError("SGLangRollout: release_memory is for one colocated training process; with several ranks set it to false")
        if self.launch is not None and rank() == 0:  # one server per job, started by rank 0
            self.server = LaunchedServer(self.launch, self.launch_python or sys.executable)
            try:
                self.server.wait_ready(self.launch_timeout_s)
            except BaseException:
                self.server.close()
                self.server = None
                raise
        if self.launch is not None:
            self.urls = [self._broadcast_url()]
            self._needs_sync = True  # a fresh server holds the launch checkpoint
            self.adapter_name = None  # and no adapter
        self.client = SGLangClient(self.timeout_s, self.max_retries, self.backoff, death_note=self._death_note)
        self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="sglang-rollout")
        for url in self.urls:
            self.client.request(url, "/health_generate", method="GET")

    def close(self) -> None:
        self.overlapping = False
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self.server is not None:
            self.server.close()
            self.server = None
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None
        self.client = None

    def _broadcast_url(self) -> str:
        url = [self.server.url if self.server is not None else None]
        if dist.is_available() and dist.is_initialized():
            dist.broadcast_object_list(url, src=0)
        return url[0]

    def _death_note(self, url: str) -> str | None:
        return self.server.death_note() if self.server is not None and url == self.server.url else None

    def _connected(self) -> SGLangClient:
        if self.client is None:
            if not hasattr(self, "eos_token_id"):
                raise RuntimeError("SGLangRollout.setup(tokenizer) must run before generate/sync_weights (RLModule.configure_model calls it)")
            self._connect()  # used again after close() (e.g. trainer.validate after trainer.fit)
        return self.client

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: Prompts, policy: nn.Module, params: SamplingParams | None = None) -> RolloutBatch:
        params = params or self.params
        self._connected()
        if self._needs_sync and self.sync_before_first_rollout:
            self.sync_weights(policy)
        n_prompts = len(prompts)
        # left padding stripped
        unpadded = [ids[mask.bool()].tolist() for ids, mask in zip(prompts.prompt_ids.cpu(), prompts.prompt_mask.cpu())]
        images = [image_data(im) if im else None for im in prompts.images] if prompts.images is not None else [None] * n_prompts
        jobs = [(p, params.samples_per_prompt, params.sampling_temperature, im) for p, im in zip(unpadded, images)]
        if params.with_baseline:
            jobs += [(p, 1, 0.0, im) for p, im in zip(unpadded, images)]
        self._resume_memory()
        version = self.weight_version  # read before the requests: a push may land while they run
        answers = self._run(jobs, version, params)
        self._release_memory()
        groups = [answers[i] + (answers[n_prompts + i] if params.with_baseline else []) for i in range(n_prompts)]
        samples = [s for group in groups for s in group]  # prompt-major
        return to_batch(prompts, samples, params.rows_per_prompt, params.with_baseline, params.eos_ids(self.eos_token_id), self.pad_token_id, version)

    def _run(self, jobs: list[tuple[list[int], int, float, list[str] | None]], version: int, params: SamplingParams) -> list[list[Sample]]:
        """One request per job, spread round-robin over the servers, at most ``max_concurrency`` in flight."""
        futures = []
        # an adapter's name carries its version: the server's own weight_version does not change on adapter loads
        check, partial, adapter = self.adapter_name is None, self.partial_rollouts and self.overlapping, self.adapter_name
        for i, (input_ids, n, temperature, images) in enumerate(jobs):
            request = sampling_params(n, temperature, params.top_p, params.top_k, params.max_new_tokens, list(params.stop_token_ids))
            url = self.urls[i % len(self.urls)]
            futures.append(self._pool.submit(generate, self.client, url, input_ids, request, version, adapter, partial, check, images))
        try:  # never a partial batch: the first failure fails the rollout
            return wait_for_answers(futures, self.deadline_s, self.progress_every_s, self.urls)
        except BaseException:
            for f in futures:
                f.cancel()
            raise
