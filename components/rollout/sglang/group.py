"""`WeightGroup`: the trainer's rank 0 and every SGLang server in one torch.distributed group (or in one group per
server), and a push of the policy's weights through it, bucket by bucket (``weight_sync: distributed``).

SGLang's side (checked against SGLang 0.5.23: ``io_struct.py``, ``http_server.py``, the model runner's
``weight_updater.py``): ``POST /init_weights_update_group {master_address, master_port, rank_offset, world_size,
group_name, backend}`` joins the server's tensor-parallel ranks as ``rank_offset + tp_rank`` inside the request
(``init_custom_process_group``: a TCP rendezvous at master_address:master_port, the store prefixed with the group's
name). The trainer is rank 0, the broadcast source, and hosts that rendezvous store, so every server must reach
master_address. In one group, server i gets rank_offset = 1 + the tp_size of the servers before it; world size = 1 +
the sum of the tp sizes (in a group of its own: rank_offset 1, world size 1 + its tp size).
``POST /update_weights_from_distributed {names, dtypes, shapes, group_name, load_format, flush_cache,
weight_version}`` allocates the bucket's tensors and receives them *inside* the request (one
broadcast per tensor, in the order named; ``load_format: flattened_bucket`` would take one uint8 broadcast per
bucket instead, which costs the trainer a copy of every bucket), then loads them into the model; it must run
between ``/begin_weight_update`` and ``/end_weight_update``. ``POST /destroy_weights_update_group
{group_name}`` leaves the group.

Order of a push: the server receives inside the request, so request k must be in flight before its data can flow,
and requests must reach the server's scheduler in bucket order. Request k + 1 is therefore sent as soon as the
first tensor of bucket k has arrived (every server is then inside handler k), while the rest of bucket k is on the
wire, and its broadcasts are queued at once (they flow when the server enters handler k + 1). Bucket k + 1 is
gathered while bucket k is on the wire, so at most two buckets of full tensors exist at a time. The new
``weight_version`` rides on the last bucket.
"""

from __future__ import annotations

from concurrent.futures import FIRST_EXCEPTION, Future, wait
from datetime import timedelta
from typing import Iterator

import torch.distributed as dist
from torch import Tensor

from ..server.buckets import WeightBuckets, drain
from ..server.group import address_towards, best_effort, in_background, join_as_rank_zero, master_store, rank_layout
from ..server.launch import free_port
from .buckets import metadata
from .client import SGLangClient, SGLangError
from .weights import succeeded, tp_size


class WeightGroup:
    """The weight-update group(s) over ``urls``; `send` sends a version through them, `close` tears them down (the
    server layer's `TransferGroup`). ``flush_cache``: the last bucket of each push drops the servers' prefix cache.

    ``per_server``: each server forms a group of its own with the trainer, and a push broadcasts to every group at
    once. Gloo serves all of a group's sockets from one thread and broadcasts down a binomial tree, so in one group the
    trainer sends a bucket to two servers one after the other (measured on two cores: 0.82 s for 1.36 GB to two
    servers, against 0.38 s to one and 0.52 s to two groups of one at once). NCCL pipelines a broadcast through the
    group, so the trainer's link carries each byte once: there one shared group is the better layout.
    """

    def __init__(
        self,
        client: SGLangClient,
        urls: list[str],
        backend: str,
        master_address: str | None,
        master_port: int | None,
        name: str,
        per_server: bool = False,
        flush_cache: bool = True,
    ):
        self.client, self.urls, self.flush_cache = client, urls, flush_cache
        self.groups: list = []  # (process group, its servers' urls), in the order the servers were given
        address = master_address or address_towards(urls[0])
        tp_sizes = [tp_size(client, url) for url in urls]
        if per_server:
            layout = [([url], [tp], f"{name}_{i}") for i, (url, tp) in enumerate(zip(urls, tp_sizes))]
        else:
            layout = [(urls, tp_sizes, name)]
        self.names = {url: group_name for members, _, group_name in layout for url in members}
        try:
            for i, (members, tps, group_name) in enumerate(layout):
                port = master_port + i if master_port else free_port(address)
                group = self._join(members, tps, backend, address, port, group_name)
                self.groups.append((group, members))
        except BaseException:
            self.close()
            raise

    def _join(self, urls: list[str], tp_sizes: list[int], backend: str, address: str, port: int, name: str):
        """One group: the trainer (rank 0, hosting the rendezvous) and ``urls``' tensor-parallel ranks."""
        offsets, world_size = rank_layout(tp_sizes)
        timeout = timedelta(seconds=self.client.timeout_s)
        try:
            store = master_store(address, port, world_size, timeout)  # before any server is asked to join it
        except Exception as err:  # noqa: BLE001 (the port is taken, the address is not this host's)
            raise SGLangError(
                f"The trainer could not host the weight update group at {address}:{port} (backend {backend}): {err}. "
                "Set model.rollout.init_args.weights.master_address / master_port to an address and free port of this host"
            ) from err
        joins = [
            in_background(
                self.client.request,
                url,
                "/init_weights_update_group",
                {
                    "master_address": address,
                    "master_port": port,
                    "rank_offset": offset,
                    "world_size": world_size,
                    "group_name": name,
                    "backend": backend,
                },
                check=succeeded(url),
                retries=0,
            )  # fmt: skip
            for url, offset in zip(urls, offsets)
        ]
        mine = in_background(join_as_rank_zero, backend, store, world_size, name, timeout)
        wait([mine, *joins], return_when=FIRST_EXCEPTION)
        failed = [(url, f.exception()) for url, f in zip(urls, joins) if f.done() and f.exception() is not None]
        if failed or (mine.done() and mine.exception() is not None):
            who, err = (
                (f"SGLang server at {failed[0][0]}", failed[0][1]) if failed else ("The trainer", mine.exception())
            )
            self._leave([u for u, f in zip(urls, joins) if f.done() and f.exception() is None])  # those that joined
            raise SGLangError(
                f"{who} could not join the weight update group at {address}:{port} (backend {backend}): {err}. "
                "Every server must reach this address and port: set model.rollout.init_args.weights.master_address / "
                "master_port"
            )
        for f in joins:
            f.result()
        return mine.result()

    def send(self, weights: WeightBuckets, buckets: Iterator[list[tuple[str, Tensor]]], version: int) -> None:
        """Send every bucket of ``weights.plan`` (``buckets`` yields each one's full tensors, in order); the last
        carries ``version``. On a failure the rest of ``buckets`` is still drained (under FSDP2 the gathers are
        collectives the other ranks take part in) and `SGLangError` names the server."""
        n = len(weights.plan)
        previous: tuple | None = None  # (broadcast handles, requests, tensors) of bucket k - 1, on the wire
        try:
            for k, bucket in enumerate(weights.plan):
                sending = [
                    t.contiguous() for _, t in next(buckets)
                ]  # gathered while bucket k - 1 is on the wire; plain tensors: no copy
                if previous is not None:  # one tensor of bucket k - 1 arrived: every server is inside handler k - 1
                    self._wait(previous[0], previous[1], k - 1, n, every=False)
                last = k == n - 1
                meta = {**metadata(bucket), "load_format": None, "flush_cache": self.flush_cache and last,
                        "abort_all_requests": False, "weight_version": str(version) if last else None}  # fmt: skip
                requests = [
                    in_background(
                        self.client.request,
                        url,
                        "/update_weights_from_distributed",
                        {**meta, "group_name": self.names[url]},
                        check=succeeded(url),
                        retries=0,
                    )
                    for url in self.urls
                ]
                handles = [
                    [dist.broadcast(t, src=0, group=group, async_op=True) for t in sending] for group, _ in self.groups
                ]  # flow once handler k starts
                if previous is not None:
                    self._wait(previous[0], previous[1], k - 1, n, every=True)
                    self._answered(previous[1])
                previous = (handles, requests, sending)
            self._wait(previous[0], previous[1], n - 1, n, every=True)
            self._answered(previous[1])
        except BaseException:
            drain(buckets)
            raise

    def _wait(self, handles: list[list], requests: list[Future], k: int, n: int, every: bool) -> None:
        """Until every broadcast of bucket k has completed (``every=False``: one in each group); a server that refused
        its request never joins them, so its answer ends the wait."""
        enough = all if every else any
        while not all(enough(h.is_completed() for h in group) for group in handles):
            wait(requests, timeout=0.005, return_when=FIRST_EXCEPTION)
            if any(f.done() and f.exception() is not None for f in requests):
                self._answered(requests)
        failed: list[str] = []
        error: Exception | None = None
        for group, (_, members) in zip(handles, self.groups):
            try:
                for handle in group:
                    if handle.is_completed():
                        handle.wait()  # raises if it failed
            except Exception as err:  # a peer died: its request names it
                failed, error = failed + members, error or err
        if error is not None:
            wait(requests, timeout=5.0)
            dead = [url for url, f in zip(self.urls, requests) if f.done() and f.exception() is not None] or failed
            raise SGLangError(
                f"SGLang server at {', '.join(dead)}: the weight broadcast of bucket {k + 1}/{n} failed ({error}); the server may have died"
            ) from error

    def _answered(self, requests: list[Future]) -> None:
        # a refusal already in first: a server that lived through a peer's death waits out its own receive timeout
        # (gloo: 120 s) before it answers, and its error would name the wrong server
        for f in sorted(requests, key=lambda f: not (f.done() and f.exception() is not None)):
            f.result()  # SGLangError naming the server (refused, or the connection dropped)

    def close(self) -> None:
        """The trainer leaves its groups (a server still waiting in a broadcast is released), then every server (best
        effort: a server that died or restarted is not in one)."""
        while self.groups:
            dist.destroy_process_group(self.groups.pop()[0])
        self._leave(self.urls)

    def _leave(self, urls: list[str]) -> None:
        for url in urls:
            best_effort(self.client, url, "/destroy_weights_update_group", {"group_name": self.names[url]})
