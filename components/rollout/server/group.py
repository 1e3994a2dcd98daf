"""The trainer's side of a weight-transfer process group with inference servers (``weight_sync: distributed``): the
trainer is rank 0, the broadcast source, and hosts the group's TCP rendezvous, which every server joins; and the
group's lifecycle over a run's pushes (`DistributedPush`), the same on every engine.

The group is registered apart from any default group the trainer runs (FSDP2, DDP), so a push never mixes with
the training collectives.
"""

from __future__ import annotations

import socket
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterator, Protocol
from urllib.parse import urlsplit

from torch import Tensor

from .buckets import WeightBuckets, drain
from .http import HTTPClient
from .ranks import rank
from .session import Pausable, paused
from .settings import WeightPush


class GroupEngine(Pausable, Protocol):
    """What `DistributedPush` asks of an engine (`Engine`): control requests to every server."""

    def each(self, urls: list[str], path: str, body: dict) -> None: ...


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


def best_effort(client: HTTPClient, url: str, path: str, body: dict) -> None:
    """``POST path`` once, with 30 s to answer and its failure ignored: tidying up on a server that may have died or
    restarted (and then holds nothing to tidy)."""
    try:
        client.request(url, path, body, retries=0, timeout_s=30.0)
    except client.error:
        pass


class TransferGroup(Protocol):
    """An engine's weight-transfer group(s) with its servers ``urls`` (SGLang's `WeightGroup`, vLLM's
    `TransferGroups`), open from its construction to `close`."""

    urls: list[str]

    def send(self, weights: WeightBuckets, buckets: Iterator[list[tuple[str, Tensor]]], version: int) -> None:
        """Send ``buckets`` (``weights``' buckets as they are gathered, in ``weights.plan``'s order) to every server, a
        push of ``version``; a failure names the server."""

    def close(self) -> None:
        """The trainer leaves the group, then every server (best effort)."""


@dataclass(frozen=True)
class GroupEndpoints:
    """An engine's endpoints for `DistributedPush` (each a path on every server)."""

    begin: str
    """POST: open a weight-update session (the server takes buckets only inside one)."""
    end: str
    """POST: close the session; sent with no version to close the session a failed push left open."""
    weight_info: str
    """GET: an answer with ``weight_version``, the last version the server loaded."""
    version_at_end: bool
    """The end request names the version pushed (``{"weight_version": v}``); False: the group's last bucket does."""
    end_before_leaving: bool
    """After a failed push the sessions are closed before the group is; False: the group first (the trainer leaving
    releases a server still inside a broadcast), then the sessions."""


class DistributedPush:
    """The weight-group lifecycle of ``weight_sync: distributed`` on ``engine``'s servers; the engine supplies its
    ``endpoints`` and ``open_group(urls, backend)``.

    A push on rank 0: the servers paused (`session.paused`), the group opened (kept across pushes), a session begun on
    every server, the buckets sent through the group, the session ended; every other rank only takes part in the
    gathers. A server that does not report the last version pushed has restarted (or missed it) and is in no group:
    the group is opened again. A failed push still gathers the rest of the buckets, drops the group and ends the
    servers' sessions, so the next push starts afresh.
    """

    def __init__(
        self,
        engine: GroupEngine,
        endpoints: GroupEndpoints,
        open_group: Callable[[list[str], str, WeightPush], TransferGroup],
    ):
        self.engine, self.endpoints, self.open_group = engine, endpoints, open_group
        self.group: TransferGroup | None = None
        self.version: int | None = None  # the last version pushed through the group

    def push(
        self, urls: list[str], weights: WeightBuckets, version: int, push: WeightPush, abort: bool, device: str
    ) -> None:
        """Every server receives ``weights`` as ``version`` (`Engine.push_buckets`), through a group at ``push``'s
        settings (``group_backend``, the rendezvous)."""
        buckets = iter(weights)  # every rank gathers each bucket, in order
        if rank() != 0:
            drain(buckets)
            return
        endpoints = self.endpoints
        end_body = {"weight_version": str(version)} if endpoints.version_at_end else {}
        try:
            with paused(self.engine, urls, abort):
                group = self._open(urls, device, push)
                self.engine.each(urls, endpoints.begin, {})
                group.send(weights, buckets, version)
                self.engine.each(urls, endpoints.end, end_body)
        except BaseException:
            drain(buckets)
            self.drop(end_sessions=True)
            raise
        self.version = version

    def drop(self, end_sessions: bool = False) -> None:
        """Close the group, if one is open; ``end_sessions``: and every server's weight-update session (a failed push:
        a server that lived through it must accept the next ``begin``)."""
        if self.group is None:
            return
        group, self.group = self.group, None
        if end_sessions and self.endpoints.end_before_leaving:
            self._end_sessions(group.urls)
        group.close()
        if end_sessions and not self.endpoints.end_before_leaving:
            self._end_sessions(group.urls)

    def _open(self, urls: list[str], device: str, push: WeightPush) -> TransferGroup:
        if self.group is not None and self._restarted(urls):
            self.drop()
        if self.group is None:
            backend = push.group_backend or ("nccl" if device == "cuda" else "gloo")
            self.group = self.open_group(urls, backend, push)
        return self.group

    def _restarted(self, urls: list[str]) -> bool:
        """Whether a server does not report the last version pushed (restarted, or it missed it: in no group)."""
        for url in urls:
            info = self.engine.client.request(url, self.endpoints.weight_info, method="GET")
            if str((info or {}).get("weight_version")) != str(self.version):
                return True
        return False

    def _end_sessions(self, urls: list[str]) -> None:
        for url in urls:
            best_effort(self.engine.client, url, self.endpoints.end, {})
