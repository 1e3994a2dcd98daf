"""`Pusher`: the policy's weights to every server as version v + 1 after every update, then checked.

From disk (a safetensors folder per version), as `WeightBuckets` (CUDA IPC or a process group, the engine's
mapping), or a LoRA adapter alone from memory; then, every ``verify_every`` pushes, each server is checked exactly (its
checksums before and after the push) and numerically (the probe): `checks`. In asynchronous training a push
also runs while requests are in flight (staged on the trainer's thread and sent from another, interrupting them for
partial rollouts, or waiting for them).

Under torch.distributed every rank calls `sync` (gathers are collectives); rank 0 talks to the servers, and a failure
on any rank fails every rank with the same message (never a rank left waiting at a barrier).
"""

from __future__ import annotations

from typing import Callable

import torch.distributed as dist
from torch import nn

from lightning_rl.core.lora import is_lora

from .adapters import Adapters, adapter_payload
from .buckets import WeightBuckets
from .checks import Checks
from .engine import Engine
from .fingerprints import Fingerprints
from .folders import WeightFolders, save_checkpoint
from .http import ServerError
from .probe import trainer_continuation
from .push_state import PushState
from .ranks import agree, rank, several_ranks
from .settings import Verification, WeightPush


class Pusher:
    """Owns the push settings (``weights``: the rollout reads them here, each engine call receives them), the push state,
    the adapters loaded, the weights folders and what the last push sent; ``engine`` and ``urls`` (the servers that
    receive weights) are set when the rollout connects."""

    def __init__(self, weights: WeightPush, verification: Verification, owner: object, prefix: str):
        self.weights = weights
        self.state = PushState()
        self.adapters = Adapters()
        self.folders = WeightFolders(weights.weight_dir, owner, prefix)
        self.engine: Engine | None = None
        self.urls: list[str] = []
        self.checks = Checks(verification)
        # asynchronous training (from prepare to close): requests may be in flight during a push
        self.overlapping = False
        self._pushed: Fingerprints | None = None  # what the last push sent (rank 0): the base of the next exact check
        self._released = False
        self.verify_next = False  # the next push is verified whatever its ordinal (servers restarted)

    @property
    def error(self) -> type[ServerError]:
        return self.engine.client.error

    @property
    def verification(self) -> Verification:
        return self.checks.verification

    @property
    def _abort(self) -> bool:
        return self.weights.partial_rollouts and self.overlapping

    # ------------------------------------------------------------------ pushes
    def sync(self, policy: nn.Module) -> None:
        """Push ``policy``'s weights to every server as the next version (rank 0 pushes, all ranks wait)."""
        engine, urls, settings = self.engine, self.urls, self.weights
        version = self.state.next_version()
        adapter = is_lora(policy) and settings.lora_sync == "adapter"
        verify = self._verify_due()
        fingerprints = self._fingerprints(adapter)
        self.resume_memory()
        before = None
        try:
            if verify and fingerprints is not None and self._pushed is not None:
                before = self.checks.before(engine, urls)
            if adapter:
                self._push_adapter(policy, self.adapters.name(version), urls)
            elif settings.weight_sync == "disk":
                folder = self.folders.version(version)
                save_checkpoint(policy, str(folder), fingerprints)  # a collective under torch.distributed
                if rank() == 0:
                    engine.push_folder(urls, str(folder), version, abort=self._abort)
                    self.folders.remove(self.state.version)
            else:
                device = next(policy.parameters()).device.type
                if settings.weight_sync == "tensor" and device != "cuda":
                    raise ValueError(
                        f"weights.weight_sync: tensor hands CUDA memory to the server (CUDA IPC), but the policy's weights "
                        f"are on {device}: CPU tensors cannot reach a server in another process. Use weights.weight_sync: "
                        "disk (or distributed)"
                    )
                buckets = WeightBuckets(policy, settings.bucket_bytes, fingerprints)
                engine.push_buckets(urls, buckets, version, settings, abort=self._abort, device=device)
            # the updates above flush the cache themselves; a separate flush is refused while requests run (asynchronous)
            if settings.flush_cache and rank() == 0 and not self.overlapping and settings.weight_sync != "distributed":
                engine.flush_cache(urls)
            failure = None
        except Exception as err:
            failure = err
        failure = agree(failure, self.error)
        if failure is not None:
            self._pushed = None  # what the servers hold now is unknown: no exact check against this push
        self._settle(failure)
        self.state.served(version)
        previous = self._pushed
        if fingerprints is not None:
            self._pushed = fingerprints
        if verify:  # before the servers release their memory: the probe runs on them
            changed = fingerprints.changed_since(previous) if before is not None else None
            checked = self.checks.after_push(engine, policy, None if adapter else version, urls, before, changed,
                                             self.adapters.current)  # fmt: skip
            self._settle(checked)
        self.release_memory()
        if several_ranks():
            dist.barrier()  # no rank samples before every server holds the new weights

    def stage(self, policy: nn.Module) -> Callable[[], None] | None:
        """Asynchronous training on one process with disk sync: save ``policy``'s weights as the next version now and
        return the push of them, for another thread to run while the trainer goes on (None where the push must stay
        on the trainer's thread: several ranks, tensor, distributed or adapter sync)."""
        adapter = is_lora(policy) and self.weights.lora_sync == "adapter"
        if several_ranks() or self.weights.weight_sync != "disk" or adapter:
            return None
        engine, urls = self.engine, self.urls
        version = self.state.next_version(staged=True)
        folder = self.folders.version(version)
        fingerprints = self._fingerprints(adapter=False)
        save_checkpoint(policy, str(folder), fingerprints)
        previous, self._pushed = self._pushed, fingerprints or self._pushed
        changed = fingerprints.changed_since(previous) if fingerprints is not None else None
        verify = self._verify_due()
        probe = self.checks.probe_for(policy) if verify else None
        expected = (
            trainer_continuation(policy, probe.prompt, probe.image_inputs) if verify else None
        )  # these weights, not the trainer's later ones

        def push() -> None:
            before = self.checks.before(engine, urls) if verify and changed is not None else None
            try:
                engine.push_folder(urls, str(folder), version, abort=self.weights.partial_rollouts)
            except Exception:
                self.state.fail()
                raise
            self.folders.remove(version - 1)
            self.state.served(version)
            if expected is not None:
                checked = self.checks.after_staged(engine, probe, *expected, version, urls, before, changed,
                                                   self.adapters.current)  # fmt: skip
                self._settle(checked)

        return push

    def unload_adapters(self, urls: list[str]) -> None:
        """The adapters this run loaded, unloaded from ``urls`` (the servers it did not launch, which outlive it)."""
        if rank() == 0 and self.engine is not None and urls:
            self.adapters.unload_all(self.engine, urls, self.weights)

    def forget_servers(self) -> None:
        """The servers are new (launched again): they hold their launch checkpoint and no adapter."""
        self.state.fresh_servers()
        self.adapters.forget()
        self._pushed = None

    # ------------------------------------------------------------------ parts
    def _fingerprints(self, adapter: bool) -> Fingerprints | None:
        """Record what this push sends, where an exact check will compare with it (rank 0, full weights)."""
        wanted = self.verification.checksums and self.verification.every > 0 and not adapter
        return Fingerprints() if wanted and rank() == 0 else None

    def _push_adapter(self, policy: nn.Module, name: str, urls: list[str]) -> None:
        config, tensors = adapter_payload(policy)  # a collective under torch.distributed
        if rank() == 0:
            self.adapters.push(self.engine, urls, name, config, tensors, self.weights)
        self.adapters.current = name

    def _settle(self, failure: BaseException | None) -> None:
        if failure is not None:
            self.state.fail()  # the next rollout pushes the whole policy again before it samples
            raise failure

    def _verify_due(self) -> bool:
        due = self.verification.every > 0 and (
            self.state.count_push() % self.verification.every == 0 or self.verify_next
        )
        self.verify_next = False
        return due

    # ------------------------------------------------------------------ colocated memory
    def resume_memory(self) -> None:
        if self.weights.release_memory and self._released and rank() == 0:
            self.engine.resume_memory(self.urls)
        self._released = False

    def release_memory(self) -> None:
        if self.weights.release_memory and rank() == 0:
            self.engine.release_memory(self.urls)
            self._released = True
