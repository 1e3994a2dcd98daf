"""The trainer's side of lightning_rl's weight-transfer engine in vLLM (the plugin's `transfer_engine`): rank 0 of a
private process group with each server's workers, gloo on CPU and nccl on GPUs, torch only (no vLLM here).

One group per server (rank 0 and the server's workers, ranks 1..): ``/init_weight_transfer_engine`` runs while this
side opens the group, since each side waits for the other in the rendezvous. A bucket is one ``/update_weights``
request per server, sent while this side broadcasts the bucket's bytes (the request returns once the worker has
received and loaded them).
"""

from __future__ import annotations

from concurrent.futures import FIRST_EXCEPTION, wait
from datetime import timedelta
from typing import Iterator

import torch
from torch import Tensor
from torch.distributed import BroadcastOptions, PrefixStore

from ..server.buckets import WeightBuckets
from ..server.group import address_towards, best_effort, in_background, master_store
from ..server.launch import free_port
from .client import VLLMClient, VLLMError

STORE_PREFIX = "lightning_rl-weights"  # as the plugin's side


def _group(backend: str, address: str, master, world_size: int, timeout: timedelta):
    """Rank 0 of the group at ``master`` (a `master_store`: made on the calling thread, see there)."""
    store = PrefixStore(STORE_PREFIX, master)
    if backend == "nccl":
        from torch.distributed import ProcessGroupNCCL

        options = ProcessGroupNCCL.Options()
        options._timeout = timeout
        return ProcessGroupNCCL(store, 0, world_size, options)
    from torch.distributed import ProcessGroupGloo

    options = ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [ProcessGroupGloo.create_device(hostname=address)]
    return ProcessGroupGloo(store, 0, world_size, options)


class TransferGroups:
    """A group with each of ``urls``; `send` broadcasts buckets to all of them, `close` ends the groups (the server
    layer's `TransferGroup`)."""

    def __init__(
        self, client: VLLMClient, urls: list[str], backend: str, master_address: str | None, master_port: int | None
    ):
        self.client, self.urls, self.backend = client, urls, backend
        self.groups: list = []
        address = master_address or address_towards(urls[0])
        timeout = timedelta(seconds=client.timeout_s)
        url, port = urls[0], master_port
        try:
            for i, url in enumerate(urls):
                world = 1 + int(client.request(url, "/get_world_size", method="GET")["world_size"])
                port = master_port + i if master_port else free_port(address)
                info = {"master_address": address, "master_port": port, "world_size": world, "rank_offset": 1,
                        "timeout_s": client.timeout_s, "backend": backend}  # fmt: skip
                store = master_store(address, port, world, timeout)  # before the server is asked to join it
                joined = in_background(client.request, url, "/init_weight_transfer_engine", {"init_info": info},
                                       retries=0)  # fmt: skip
                mine = in_background(_group, backend, address, store, world, timeout)
                wait([joined, mine], return_when=FIRST_EXCEPTION)  # a refused join never comes to the rendezvous
                joined.result()
                self.groups.append(mine.result())
        except Exception as err:
            self.close()
            raise VLLMError(
                f"vLLM server at {url} could not join the weight transfer group at {address}:{port} ({backend}): "
                f'{err}. The server must run with --weight-transfer-config \'{{"backend": "lightning_rl"}}\' and the '
                "plugin on its PYTHONPATH (launch: does both), and reach this address: set weights.master_address / "
                "master_port"
            ) from err

    def send(self, weights: WeightBuckets, buckets: Iterator[list[tuple[str, Tensor]]], version: int) -> None:
        """Each bucket's names, dtypes and shapes in its ``/update_weights`` request, its bytes in one broadcast (the
        version rides on ``/finish_weight_update``)."""
        device = "cuda" if self.backend == "nccl" else "cpu"
        options = BroadcastOptions()
        options.rootRank, options.rootTensor = 0, 0
        for k, bucket in enumerate(buckets):
            info = {"names": [name for name, _ in bucket],
                    "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                    "shapes": [list(t.shape) for _, t in bucket]}  # fmt: skip
            requests = [in_background(self.client.request, url, "/update_weights", {"update_info": info}, retries=0)
                        for url in self.urls]  # fmt: skip
            data = torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8).to(device) for _, t in bucket])
            for work in [group.broadcast([data], options) for group in self.groups]:
                try:
                    work.wait()
                except Exception as err:  # a peer died: its request names it
                    failed = [u for u, f in zip(self.urls, requests) if f.done() and f.exception() is not None]
                    raise VLLMError(
                        f"vLLM server at {', '.join(failed or self.urls)}: the weight broadcast of bucket {k + 1} "
                        f"failed ({err}); the server may have died"
                    ) from err
            for f in requests:
                f.result()

    def close(self) -> None:
        """The trainer leaves first (a worker waiting in a broadcast is released), then each server (best effort)."""
        self.groups.clear()
        for url in self.urls:
            best_effort(self.client, url, "/shutdown_weight_transfer_engine", {})
