"""`WeightSync`: how `SGLangRollout` moves the policy's weights to its servers, as weight version v + 1 after every
update: from disk, as tensors (CUDA IPC), or a LoRA adapter alone; in asynchronous training also while requests
are in flight (a push staged on the trainer's thread and sent from another, or interrupting them for partial
rollouts)."""

from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path

import torch.distributed as dist
from torch import nn

from lightning_rl.core.lora import is_lora

from .weights import flush_caches, push_adapter, push_from_disk, push_tensors, rank, save_adapter_version, save_checkpoint


class WeightSync:
    """The weight half of `SGLangRollout` (its attributes are set there)."""

    # ------------------------------------------------------------------ weights
    def sync_weights(self, policy: nn.Module) -> None:
        """Push ``policy``'s weights to every server as ``weight_version + 1`` (rank 0 pushes, all ranks wait)."""
        client = self._connected()
        version = str(self.weight_version + 1)
        urls = self.weight_update_urls or self.urls
        self._resume_memory()
        if is_lora(policy) and self.lora_sync == "adapter":
            directory = self._checkpoint_dir(version)
            save_adapter_version(policy, str(directory))  # a collective under torch.distributed
            name = f"policy-v{version}"
            if rank() == 0:
                push_adapter(client, urls, str(directory), name, self.adapter_name)
                shutil.rmtree(directory.parent / f"v{self.weight_version}", ignore_errors=True)
            self.adapter_name = name
        elif self.weight_sync == "disk":
            directory = self._checkpoint_dir(version)
            save_checkpoint(policy, str(directory))  # a collective under torch.distributed
            if rank() == 0:
                push_from_disk(client, urls, str(directory), version, abort=self.partial_rollouts and self.overlapping)
                shutil.rmtree(directory.parent / f"v{self.weight_version}", ignore_errors=True)
        elif rank() == 0:
            for url in urls:
                push_tensors(client, url, policy, version, self.tensor_bucket_mb << 20, abort=self.partial_rollouts and self.overlapping)
        # the updates above flush the cache themselves; a separate flush is refused while requests run (asynchronous)
        if self.flush_cache and rank() == 0 and not self.overlapping:
            flush_caches(client, urls)
        self._release_memory()
        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # no rank samples before every server holds the new weights
        self.weight_version = int(version)
        self._needs_sync = False

    def stage_weights(self, policy: nn.Module):
        """Asynchronous training on one process with disk sync: save ``policy``'s weights as the next version now and
        return the push of them, for another thread to run while the trainer goes on (None where the push must stay
        on the trainer's thread: several ranks, tensor or adapter sync)."""
        several_ranks = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if several_ranks or self.weight_sync != "disk" or (is_lora(policy) and self.lora_sync == "adapter"):
            return None
        client, urls = self._connected(), self.weight_update_urls or self.urls
        self._staged = max(self._staged, self.weight_version) + 1
        version, directory = self._staged, self._checkpoint_dir(str(self._staged))
        save_checkpoint(policy, str(directory))

        def push() -> None:
            push_from_disk(client, urls, str(directory), str(version), abort=self.partial_rollouts)
            shutil.rmtree(directory.parent / f"v{version - 1}", ignore_errors=True)
            self.weight_version = version

        return push

    def prepare(self, policy: nn.Module) -> None:
        """Asynchronous training: connect and push the first weights here, on the trainer's thread; from now until
        ``close`` requests may be in flight during a push (no separate cache flush; partial rollouts interrupt them)."""
        if is_lora(policy) and self.lora_sync == "adapter":
            raise ValueError("asynchronous training (model.loop.max_staleness > 0) with a LoRA policy needs lora_sync: merged: "
                             "an adapter push unloads the adapter that requests in flight are sampling with")
        self._connected()
        if self._needs_sync and self.sync_before_first_rollout:
            self.sync_weights(policy)
        self.overlapping = True

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

