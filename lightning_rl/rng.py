"""The random streams of the RL iterations: kept apart from every other user of torch's generator, per rank, and
saved in checkpoints (`lightning_rl.checkpoint`), so a resumed run samples exactly what the original would have."""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from lightning_rl.core.ops import dist_ready


def global_random_state() -> dict[str, Tensor]:
    """torch's global random state now: ``torch`` (the CPU generator) and, once CUDA is initialized, ``cuda``."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_global_random_state(state: dict[str, Any]) -> None:
    """Set what `global_random_state` returned (other keys are ignored)."""
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]  # older checkpoints hold every device's state
        torch.cuda.set_rng_state_all(cuda) if isinstance(cuda, (list, tuple)) else torch.cuda.set_rng_state(cuda)


class IterationRNG:
    """torch's global random state as the RL iterations see it, kept apart from every other user.

    Sampling (``generate``) draws from torch's global generator, and so does Lightning between
    iterations (a DataLoader's base seed when validation starts, ...). ``scope`` swaps this
    stream in for one iteration and the rest of the world's back out, so a run resumed from a
    checkpoint (which stores ``state``) samples exactly what the original run sampled.
    On its first use on rank r > 0 the stream is reseeded with (seed + r): every rank starts from the
    same seed (``seed_everything``, or torch's fixed default) and would otherwise draw the same noise.
    """

    def __init__(self) -> None:
        self.state: dict[str, Tensor] | None = None

    @contextmanager
    def scope(self, rank: int):
        outside = global_random_state()
        if self.state is not None:
            set_global_random_state(self.state)
        elif rank > 0:
            torch.manual_seed((torch.initial_seed() + rank) % 2**63)
        try:
            yield
        finally:
            self.state = global_random_state()
            set_global_random_state(outside)

    def current(self) -> dict[str, Tensor]:
        """The state the next iteration starts from."""
        return self.state if self.state is not None else global_random_state()


def gather_rng_states(stream: IterationRNG, generators: dict[str, torch.Generator]) -> list[dict[str, Tensor]]:
    """Every rank's random state (``stream`` and ``generators``), in rank order. Collective."""
    mine = {**stream.current(), **{name: g.get_state() for name, g in generators.items()}}
    if not dist_ready():
        return [mine]
    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, mine)
    return states


def restore_rng_states(
    states: list[dict[str, Tensor]] | dict[str, Tensor], stream: IterationRNG, generators: dict[str, torch.Generator]
) -> None:
    """Set this rank's ``stream`` and ``generators`` from ``gather_rng_states`` output (warns when the world size changed)."""
    if isinstance(states, dict):  # checkpoints written before per-rank states: one state for all ranks
        states = [states]
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist_ready() else (0, 1)
    if len(states) != world:
        warnings.warn(
            f"the checkpoint holds random states of {len(states)} rank(s), this run has {world}: sampling continues, but not as the original run would have"
        )
    state = states[rank % len(states)]
    stream.state = {k: v for k, v in state.items() if k in ("torch", "cuda")}
    for name, g in generators.items():
        if name in state:
            g.set_state(state[name])
