"""A LoRA policy's adapter pushed alone (``lora_sync: adapter``): its tensors from the trainer's memory, loaded on every
server under a new name per version (``policy-<run>-v<version>``), the newest few kept loaded and all unloaded on close.

``<run>`` is drawn once per training process (shared by its ranks): a server that outlives a run, or a run resumed from
a checkpoint, still holds the earlier process's adapters, and SGLang and vLLM both refuse to load a name they hold."""

from __future__ import annotations

import secrets
import warnings
from collections import deque
from typing import TYPE_CHECKING

from torch import Tensor, nn

from lightning_rl.core.lora import adapter_config, adapter_file_tensors, adapter_state

from .ranks import share

if TYPE_CHECKING:
    from .engine import Engine
    from .settings import WeightPush


def adapter_payload(policy: nn.Module) -> tuple[dict, dict[str, Tensor]]:
    """The adapter's config and CPU tensors as peft writes them (a collective under FSDP2: every rank gathers)."""
    state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in adapter_state(policy).items()}
    return adapter_config(policy), adapter_file_tensors(policy, state)


class Adapters:
    """The adapters loaded on the servers, oldest first. ``keep``: how many stay loaded (asynchronous training keeps
    ``max_staleness + 1``: a request in flight finishes on the adapter it started with)."""

    def __init__(self) -> None:
        self.loaded: deque[str] = deque()
        self.keep = 1
        self.current: str | None = None  # the adapter that samples
        self.run: str | None = None  # drawn at the first push (a collective: every rank takes rank 0's)

    def name(self, version: int) -> str:
        if self.run is None:
            self.run = share(secrets.token_hex(4))
        return f"policy-{self.run}-v{version}"

    def push(
        self, engine: Engine, urls: list[str], name: str, config: dict, tensors: dict[str, Tensor], push: WeightPush
    ) -> None:
        engine.load_adapter(urls, name, config, tensors, push)
        self.loaded.append(name)
        while len(self.loaded) > self.keep:
            engine.unload_adapter(urls, self.loaded.popleft(), push)

    def unload_all(self, engine: Engine, urls: list[str], push: WeightPush) -> None:
        """At the end of a run: a server that outlives it keeps no adapter of ours (best effort: one that has died
        holds nothing, and a run ending on an error keeps that error; after one failure the rest are not tried, so a
        server that is gone costs one request's retries)."""
        while self.loaded:
            try:
                engine.unload_adapter(urls, self.loaded[0], push)
            except Exception as err:  # noqa: BLE001 - closing must not hide the run's own outcome
                warnings.warn(
                    f"LoRA adapters {list(self.loaded)} were not unloaded from {', '.join(urls)} at close: {err}"
                )
                break
            self.loaded.popleft()
        self.loaded.clear()
        self.current = None

    def forget(self) -> None:
        """A fresh server holds no adapter."""
        self.loaded.clear()
        self.current = None
