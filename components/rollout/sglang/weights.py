"""Getting the trainer's weights to SGLang: a Hugging Face checkpoint on disk, or tensors by CUDA IPC.

Disk (portable: any host that reads the directory). ``save_pretrained`` writes safetensors; SGLang's
``POST /update_weights_from_disk`` takes ``{model_path, load_format, abort_all_requests,
weight_version, flush_cache}`` (``UpdateWeightFromDiskReqInput`` in ``sglang/srt/managers/io_struct.py``)
and needs no weight-update session.

Tensor (the server shares this host and GPU). ``POST /update_weights_from_tensor`` takes
``serialized_named_tensors``: one entry per tensor-parallel rank, each the base64 text of a
``ForkingPickler`` dump of ``[(name, tensor), ...]`` (SGLang's ``MultiprocessingSerializer``). For CUDA
tensors the pickle holds CUDA IPC handles, not data, so the server maps the trainer's memory: same host
only. SGLang's scheduler asserts an open ``/begin_weight_update`` ... ``/end_weight_update`` session
around tensor (and distributed) updates (``SchedulerWeightUpdaterManager``); disk updates need none.

CPU tensors cannot take that road to another process (multiprocessing's shared-memory handover needs the
server to be our child: SGLang answers "digest sent was rejected"), so tensor sync of a policy on the CPU is refused.

LoRA policies with ``lora_sync="merged"``: the adapters are folded into the base (W + alpha/r B A) and the full
weights go out as without LoRA (``lora_sync="adapter"``: `adapters`).
"""

from __future__ import annotations

import base64
import io
from multiprocessing.reduction import ForkingPickler
from typing import Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lightning_rl.core.lora import is_lora, merged_state_dict

from .buckets import gather, plan_buckets
from .client import RETRY_STATUSES, SGLangClient, SGLangError


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def full_state_dict(policy: nn.Module) -> dict[str, Tensor]:
    """Unsharded weights as the server names them (LoRA adapters merged); under torch.distributed a collective
    (every rank calls it), gathered to CPU."""
    if not (dist.is_available() and dist.is_initialized()):
        state = policy.state_dict()
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return merged_state_dict(policy, state) if is_lora(policy) else state


def save_checkpoint(policy: nn.Module, directory: str) -> None:
    """Write ``policy`` as a Hugging Face checkpoint (config + safetensors); rank 0 writes, every rank gathers."""
    state = full_state_dict(policy)
    if rank() == 0:
        policy.save_pretrained(directory, state_dict=state)


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


def tensor_buckets(policy: nn.Module, bucket_bytes: int) -> Iterator[list[tuple[str, Tensor]]]:
    """The policy's weights as ``(name, tensor)`` lists of about ``bucket_bytes`` each (one request per bucket)."""
    state = policy.state_dict(keep_vars=True)
    for name, tensor in state.items():
        if hasattr(tensor, "full_tensor"):
            raise ValueError(
                f"SGLangRollout weight_sync='tensor' needs plain (unsharded) tensors, but '{name}' is a {type(tensor).__name__}; "
                "use weight_sync: distributed (or disk) with sharded (FSDP) policies"
            )
    for bucket in plan_buckets(policy, bucket_bytes):
        yield [(w.name, t) for w, t in zip(bucket, gather(state, bucket))]


@torch.no_grad()
def tensor_payloads(policy: nn.Module, bucket_bytes: int, tp_size: int, weight_version: str) -> Iterator[dict]:
    """``/update_weights_from_tensor`` request bodies; the last one carries the new ``weight_version``."""
    buckets = list(
        tensor_buckets(policy, bucket_bytes)
    )  # references (merged LoRA weights: copies) kept until the server has them
    for i, bucket in enumerate(buckets):
        serialized = serialize_named_tensors(bucket)
        last = i == len(buckets) - 1
        yield {
            "serialized_named_tensors": [serialized] * tp_size,
            "load_format": None,
            "flush_cache": last,
            "weight_version": weight_version if last else None,
        }


def push_from_disk(client: SGLangClient, urls: list[str], directory: str, version: str, abort: bool = False) -> None:
    """``abort``: end the requests in flight first (partial rollouts continue them with the new weights); otherwise
    the server applies the update once they finish, and holds new requests until it is done."""
    body = {"model_path": directory, "flush_cache": True, "weight_version": version, "abort_all_requests": abort}
    for url in urls:
        client.request(url, "/update_weights_from_disk", body, check=succeeded(url))


def push_tensors(
    client: SGLangClient, url: str, policy: nn.Module, version: str, bucket_bytes: int, abort: bool = False
) -> None:
    """One ``/begin_weight_update`` ... ``/end_weight_update`` session of ``/update_weights_from_tensor`` requests."""
    client.request(url, "/begin_weight_update", {}, check=succeeded(url))
    try:
        for i, body in enumerate(tensor_payloads(policy, bucket_bytes, tp_size(client, url), version)):
            body["abort_all_requests"] = abort and i == 0
            client.request(url, "/update_weights_from_tensor", body, check=succeeded(url))
    finally:
        client.request(url, "/end_weight_update", {}, check=succeeded(url))


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
