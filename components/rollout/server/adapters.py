"""A LoRA policy's adapter pushed alone (``lora_sync: adapter``): its tensors from the trainer's memory, loaded on every
server under a new name per version (``policy-v<version>``), the newest few kept loaded."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from torch import Tensor, nn

from lightning_rl.core.lora import adapter_config, adapter_file_tensors, adapter_state

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

    def push(
        self, engine: Engine, urls: list[str], name: str, config: dict, tensors: dict[str, Tensor], push: WeightPush
    ) -> None:
        engine.load_adapter(urls, name, config, tensors, push)
        self.loaded.append(name)
        while len(self.loaded) > self.keep:
            engine.unload_adapter(urls, self.loaded.popleft(), push)

    def forget(self) -> None:
        """A fresh server holds no adapter."""
        self.loaded.clear()
        self.current = None
