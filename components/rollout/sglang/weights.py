"""Getting the trainer's weights to SGLang: a Hugging Face checkpoint on disk, or tensors by CUDA IPC.

Disk (portable: any host that reads the directory). SGLang's ``POST /update_weights_from_disk`` takes ``{model_path,
load_format, abort_all_requests, weight_version, flush_cache}`` (``UpdateWeightFromDiskReqInput`` in
``sglang/srt/managers/io_struct.py``) and needs no weight-update session; SGLang applies it once the requests in
flight are answered (or ends them first, ``abort_all_requests``) and holds new ones until it is done.

Tensor (the server shares this host and GPU). ``POST /update_weights_from_tensor`` takes ``serialized_named_tensors``:
one entry per tensor-parallel rank, each the base64 text of a ``ForkingPickler`` dump of ``[(name, tensor), ...]``
(SGLang's ``MultiprocessingSerializer``). For CUDA tensors the pickle holds CUDA IPC handles, not data, so the server
maps the trainer's memory: same host only. SGLang's scheduler asserts an open ``/begin_weight_update`` ...
``/end_weight_update`` session around tensor (and distributed) updates (``SchedulerWeightUpdaterManager``); disk
updates need none.

CPU tensors cannot take that road to another process (multiprocessing's shared-memory handover needs the server to be
our child: SGLang answers "digest sent was rejected"), so tensor sync of a policy on the CPU is refused.
"""

from __future__ import annotations

import base64
import io
from multiprocessing.reduction import ForkingPickler
from typing import Iterable, Iterator

import torch
from torch import Tensor, nn

from ..server.buckets import WeightBuckets
from .client import RETRY_STATUSES, SGLangClient, SGLangError


def serialize_named_tensors(named: list[tuple[str, Tensor]]) -> str:
    """Base64 text of a ``ForkingPickler`` dump: the format of SGLang's ``MultiprocessingSerializer.serialize(obj, output_str=True)``.

    Uses SGLang's own serializer when sglang is importable here (it also patches torch's CUDA
    reductions to name devices by UUID, for processes with different ``CUDA_VISIBLE_DEVICES``).
    """
    try:
        from sglang.srt.utils import MultiprocessingSerializer
    except ImportError:
        buffer = io.BytesIO()
        ForkingPickler(buffer).dump(named)
        return base64.b64encode(buffer.getvalue()).decode()
    return MultiprocessingSerializer.serialize(named, output_str=True)


def plain(weights: WeightBuckets) -> WeightBuckets:
    """``weights``, refused when a tensor is sharded: CUDA IPC hands over one process's memory as it is."""
    for name, tensor in weights.state.items():
        if hasattr(tensor, "full_tensor"):
            raise ValueError(
                f"weight_sync='tensor' needs plain (unsharded) tensors, but '{name}' is a {type(tensor).__name__}; "
                "use weights.weight_sync: distributed (or disk) with sharded (FSDP) policies"
            )
    return weights


def tensor_buckets(policy: nn.Module, bucket_bytes: int) -> Iterator[list[tuple[str, Tensor]]]:
    """The policy's weights as ``(name, tensor)`` lists of about ``bucket_bytes`` each (one request per bucket)."""
    return iter(plain(WeightBuckets(policy, bucket_bytes)))


@torch.no_grad()
def payloads(buckets: Iterable[list[tuple[str, Tensor]]], tp_size: int, weight_version: str) -> Iterator[dict]:
    """``/update_weights_from_tensor`` request bodies; the last one carries the new ``weight_version``."""
    buckets = list(buckets)  # references (merged LoRA weights: copies) kept until the server has them
    for i, bucket in enumerate(buckets):
        serialized = serialize_named_tensors(bucket)
        last = i == len(buckets) - 1
        yield {
            "serialized_named_tensors": [serialized] * tp_size,
            "load_format": None,
            "flush_cache": last,
            "weight_version": weight_version if last else None,
        }


def tensor_payloads(policy: nn.Module, bucket_bytes: int, tp_size: int, weight_version: str) -> Iterator[dict]:
    return payloads(tensor_buckets(policy, bucket_bytes), tp_size, weight_version)


def push_from_disk(client: SGLangClient, urls: list[str], directory: str, version: str, abort: bool = False) -> None:
    """``abort``: end the requests in flight first (partial rollouts continue them with the new weights); otherwise
    the server applies the update once they finish, and holds new requests until it is done."""
    body = {"model_path": directory, "flush_cache": True, "weight_version": version, "abort_all_requests": abort}
    for url in urls:
        client.request(url, "/update_weights_from_disk", body, check=succeeded(url))


def send_tensors(
    client: SGLangClient, url: str, buckets: Iterable[list[tuple[str, Tensor]]], version: str, abort: bool = False
) -> None:
    """One ``/begin_weight_update`` ... ``/end_weight_update`` session of ``/update_weights_from_tensor`` requests."""
    client.request(url, "/begin_weight_update", {}, check=succeeded(url))
    try:
        for i, body in enumerate(payloads(buckets, tp_size(client, url), version)):
            body["abort_all_requests"] = abort and i == 0
            client.request(url, "/update_weights_from_tensor", body, check=succeeded(url))
    finally:
        client.request(url, "/end_weight_update", {}, check=succeeded(url))


def push_tensors(
    client: SGLangClient, url: str, policy: nn.Module, version: str, bucket_bytes: int, abort: bool = False
) -> None:
    send_tensors(client, url, tensor_buckets(policy, bucket_bytes), version, abort)


def tp_size(client: SGLangClient, url: str) -> int:
    """The server's tensor-parallel size (``server_args.tp_size`` in ``/server_info``)."""
    info = client.request(url, "/server_info", method="GET")
    return int(info.get("tp_size", 1)) if isinstance(info, dict) else 1


def flush_caches(client: SGLangClient, urls: list[str]) -> None:
    """``POST /flush_cache``; SGLang answers 400 while requests still run, so 400 is retried."""
    for url in urls:
        client.request(url, "/flush_cache", retry_statuses=(400, *RETRY_STATUSES))


def succeeded(url: str):
    def check(answer) -> None:
        if isinstance(answer, dict) and answer.get("success") is False:
            raise SGLangError(f"SGLang server at {url} refused the weight update: {answer.get('message')}")

    return check
