"""`WeightSync`: how `SGLangRollout` moves the policy's weights to its servers, as weight version v + 1 after every
update: from disk, as tensors (CUDA IPC), through a process group (`distributed`), or a LoRA adapter alone from
memory; then, every ``verify_every`` pushes, checks that each server holds them (`verify`). In asynchronous training
a push also runs while requests are in flight (staged on the trainer's thread and sent from another, interrupting
them for partial rollouts, or waiting for them).

Under torch.distributed every rank calls `sync_weights` (gathers are collectives); rank 0 talks to the servers, and
a failure on any rank fails every rank with the same message (never a rank left waiting at a barrier).
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from lightning_rl.core.lora import is_lora

from .adapters import adapter_payload, push_adapter, unload_adapter
from .broadcast import DistributedPush
from .client import SGLangError
from .verify import check, server_continuation, server_scores, trainer_continuation, trainer_scores
from .weights import flush_caches, push_from_disk, push_tensors, rank, save_checkpoint


def _several_ranks() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def agree(failure: BaseException | None) -> BaseException | None:
    """The first failure of any rank, on every rank (a collective under torch.distributed)."""
    if not _several_ranks():
        return failure
    messages: list = [None] * dist.get_world_size()
    dist.all_gather_object(messages, None if failure is None else f"{type(failure).__name__}: {failure}")
    if failure is None and any(messages):
        failure = SGLangError(next(m for m in messages if m))
    return failure


def check_weight_options(
    weight_sync: str,
    lora_sync: str,
    group_backend: str | None,
    bucket_mb: float,
    verify_every: int,
    verify_tolerance: float,
) -> None:
    """`SGLangRollout`'s weight options, refused at construction with the fix."""
    if weight_sync not in ("disk", "tensor", "distributed"):
        raise ValueError(f"SGLangRollout: weight_sync must be 'disk', 'tensor' or 'distributed', got {weight_sync!r}")
    if weight_sync == "tensor" and not torch.cuda.is_available():
        raise ValueError(
            "SGLangRollout: weight_sync: tensor hands CUDA memory to the server (CUDA IPC), and this process has no CUDA device: "
            "CPU tensors cannot reach a server in another process. Use weight_sync: disk (or distributed)"
        )
    if group_backend not in (None, "nccl", "gloo") or not bucket_mb > 0 or verify_every < 0 or not verify_tolerance > 0:
        raise ValueError(
            f"SGLangRollout: need group_backend nccl/gloo/null, bucket_mb > 0, verify_every >= 0 and verify_tolerance > 0; "
            f"got {group_backend!r}, {bucket_mb}, {verify_every}, {verify_tolerance}"
        )
    if lora_sync not in ("adapter", "merged"):
        raise ValueError(f"SGLangRollout: lora_sync must be 'adapter' or 'merged', got {lora_sync!r}")


class WeightSync(DistributedPush):
    """The weight half of `SGLangRollout` (its attributes are set there)."""

    def sync_weights(self, policy: nn.Module) -> None:
        """Push ``policy``'s weights to every server as ``weight_version + 1`` (rank 0 pushes, all ranks wait)."""
        client = self._connected()
        version = str(self.weight_version + 1)
        urls = self.weight_update_urls or self.urls
        adapter = is_lora(policy) and self.lora_sync == "adapter"
        verify = self._verify_due()
        self._resume_memory()
        try:
            if adapter:
                self._push_adapter(policy, f"policy-v{version}", urls)
            elif self.weight_sync == "disk":
                directory = self._checkpoint_dir(version)
                save_checkpoint(policy, str(directory))  # a collective under torch.distributed
                if rank() == 0:
                    push_from_disk(
                        client, urls, str(directory), version, abort=self.partial_rollouts and self.overlapping
                    )
                    shutil.rmtree(directory.parent / f"v{self.weight_version}", ignore_errors=True)
            elif self.weight_sync == "tensor":
                self._check_tensor_device(policy)
                if rank() == 0:
                    for url in urls:
                        push_tensors(
                            client,
                            url,
                            policy,
                            version,
                            int(self.bucket_mb * 2**20),
                            abort=self.partial_rollouts and self.overlapping,
                        )
            else:
                self._push_distributed(policy, version, urls)  # flushes with its last bucket
            # the updates above flush the cache themselves; a separate flush is refused while requests run (asynchronous)
            if self.flush_cache and rank() == 0 and not self.overlapping and self.weight_sync != "distributed":
                flush_caches(client, urls)
            failure = None
        except Exception as err:
            failure = err
        self._settle(agree(failure))
        self.weight_version, self._needs_sync, self._push_failed = int(version), False, False
        if verify:  # before the servers release their memory: the probe runs on them
            self._settle(self._verify(policy, None if adapter else version, urls))
        self._release_memory()
        if _several_ranks():
            dist.barrier()  # no rank samples before every server holds the new weights

    def stage_weights(self, policy: nn.Module):
        """Asynchronous training on one process with disk sync: save ``policy``'s weights as the next version now and
        return the push of them, for another thread to run while the trainer goes on (None where the push must stay
        on the trainer's thread: several ranks, tensor, distributed or adapter sync)."""
        if _several_ranks() or self.weight_sync != "disk" or (is_lora(policy) and self.lora_sync == "adapter"):
            return None
        client, urls = self._connected(), self.weight_update_urls or self.urls
        self._staged = max(self._staged, self.weight_version) + 1
        version, directory = self._staged, self._checkpoint_dir(str(self._staged))
        save_checkpoint(policy, str(directory))
        expected = (
            trainer_continuation(policy, self._probe) if self._verify_due() else None
        )  # these weights, not the trainer's later ones

        def push() -> None:
            try:
                push_from_disk(client, urls, str(directory), str(version), abort=self.partial_rollouts)
            except Exception:
                self._push_failed = True
                raise
            shutil.rmtree(directory.parent / f"v{version - 1}", ignore_errors=True)
            self.weight_version, self._push_failed = version, False
            if expected is not None:
                self._settle(self._verify_scores(*expected, str(version), urls))

        return push

    def prepare(self, policy: nn.Module, max_staleness: int = 1) -> None:
        """Asynchronous training: connect and push the first weights here, on the trainer's thread; from now until
        ``close`` requests may be in flight during a push (no separate cache flush; partial rollouts interrupt them).
        A LoRA adapter push keeps the ``max_staleness + 1`` newest adapters loaded: requests in flight finish on theirs."""
        self._keep_adapters = max_staleness + 1
        self._connected()
        if self._needs_sync and self.sync_before_first_rollout:
            self.sync_weights(policy)
        self.overlapping = True

    # ------------------------------------------------------------------ parts
    def _push_adapter(self, policy: nn.Module, name: str, urls: list[str]) -> None:
        config, tensors = adapter_payload(policy)  # a collective under torch.distributed
        if rank() == 0:
            push_adapter(self.client, urls, name, config, tensors)
            self._adapters.append(name)
            while len(self._adapters) > self._keep_adapters:
                unload_adapter(self.client, urls, self._adapters.popleft())
        self.adapter_name = name

    def _check_tensor_device(self, policy: nn.Module) -> None:
        device = next(policy.parameters()).device
        if device.type != "cuda":
            raise ValueError(
                f"SGLangRollout weight_sync: tensor hands CUDA memory to the server (CUDA IPC), but the policy's weights are on {device.type}: "
                "CPU tensors cannot reach a server in another process. Use weight_sync: disk (or distributed)"
            )

    def _settle(self, failure: BaseException | None) -> None:
        if failure is not None:
            self._push_failed = True  # the next rollout pushes the whole policy again before it samples
            raise failure

    def _verify_due(self) -> bool:
        self._pushes += 1
        return self.verify_every > 0 and self._pushes % self.verify_every == 0

    def _verify(self, policy: nn.Module, version: str | None, urls: list[str]) -> BaseException | None:
        """Each server continues the probe; the trainer scores every continuation (on every rank); the failure, or None."""
        probes: list = [None]
        if rank() == 0:
            try:
                probes = [[server_continuation(self.client, url, self._probe, self.adapter_name) for url in urls]]
            except SGLangError as err:
                probes = [err]
        if _several_ranks():
            dist.broadcast_object_list(probes, src=0)  # the continuations every rank scores
        if isinstance(probes[0], BaseException):
            return probes[0] if rank() == 0 else SGLangError(str(probes[0]))
        expected = trainer_scores(policy, self._probe, [ids for ids, _, _ in probes[0]])  # (S, R)
        try:
            for url, (_, served, served_version), mine in zip(urls, probes[0], expected):
                check(url, served, mine, served_version, version, self.verify_tolerance)
        except SGLangError as err:
            return err
        return None

    def _verify_scores(self, continuation: list[int], expected, version: str, urls: list[str]) -> BaseException | None:
        """A staged push (one process): every server scores the trainer's continuation, written when it was staged."""
        try:
            for url in urls:
                served, served_version = server_scores(self.client, url, self._probe, continuation, self.adapter_name)
                check(url, served, expected, served_version, version, self.verify_tolerance)
        except SGLangError as err:
            return err
        return None

    def _checkpoint_dir(self, version: str) -> Path:
        if self.weight_dir is None and self._own_dir is None:
            self._own_dir = tempfile.mkdtemp(prefix="lightning_rl_sglang_weights_")
            # a policy-sized copy: removed on close, and at exit when a failed run never closes the rollout
            weakref.finalize(self, shutil.rmtree, self._own_dir, ignore_errors=True)
        return Path(self.weight_dir or self._own_dir) / f"v{version}"

    def _resume_memory(self) -> None:
        if self.release_memory and self._released and rank() == 0:
            for url in self.weight_update_urls or self.urls:
                self.client.request(url, "/resume_memory_occupation", {})
        self._released = False

    def _release_memory(self) -> None:
        if self.release_memory and rank() == 0:
            for url in self.weight_update_urls or self.urls:
                self.client.request(url, "/release_memory_occupation", {})
            self._released = True
