"""The trainer's side of a weight-transfer process group with inference servers: the trainer is rank 0, the broadcast
source, and hosts the group's TCP rendezvous, which every server joins (``weight_sync: distributed``).

The group is registered apart from any default group the trainer runs (FSDP2, DDP), so a push never mixes with
the training collectives.
"""

from __future__ import annotations

import socket
import threading
from concurrent.futures import Future
from datetime import timedelta
from typing import Any, Callable
from urllib.parse import urlsplit


def address_towards(url: str) -> str:
    """This host's address on the route to ``url``'s host (what a server there can connect back to)."""
    parts = urlsplit(url)
    with socket.socket(socket.AF_INET6 if ":" in (parts.hostname or "") else socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((parts.hostname, parts.port or 80))  # UDP: picks the route, sends nothing
        return sock.getsockname()[0]


def rank_layout(tp_sizes: list[int]) -> tuple[list[int], int]:
    """Each server's rank offset and the group's world size: the trainer is rank 0, then each server's tensor-parallel
    ranks in turn (server i's rank_offset = 1 + the tp sizes of the servers before it)."""
    return [1 + sum(tp_sizes[:i]) for i in range(len(tp_sizes))], 1 + sum(tp_sizes)


def in_background(fn: Callable[..., Any], *args, **kwargs) -> Future:
    """``fn(*args, **kwargs)`` on a daemon thread: a rendezvous or a request left waiting by a failed push must not
    hold the process at exit (a pool's threads are joined there)."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as err:  # noqa: BLE001 (handed to whoever waits)
            future.set_exception(err)

    threading.Thread(target=run, daemon=True, name="weight-group").start()
    return future


def master_store(address: str, port: int, world_size: int, timeout: timedelta):
    """The rendezvous' TCP store at address:port, this process its master. Made on the calling thread, before the
    rendezvous goes to the background: a store still starting its server thread on a daemon thread when the process
    exits (a server that refused to join at once, then the run's one-line error) aborts it, "terminate called without
    an active exception", status 134."""
    from torch.distributed import TCPStore

    return TCPStore(address, port, world_size, is_master=True, timeout=timeout, wait_for_workers=False)


def join_as_rank_zero(backend: str, store, world_size: int, name: str, timeout: timedelta):
    """Rank 0 of a group the servers create the way SGLang's ``init_custom_process_group`` does: a TCP rendezvous at
    `master_store`, the store prefixed with the group's name, then torch's own prefixes."""
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world

    group, _ = _new_process_group_helper(
        world_size, 0, [], Backend(backend), PrefixStore(name, store), group_name=name, timeout=timeout
    )
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group
