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

LoRA policies. ``lora_sync="adapter"``: the adapter alone is written in peft's format and loaded under a
new name per version with ``POST /load_lora_adapter {lora_name, lora_path}``; ``/generate`` names it in
``lora_path``, and the previous version is dropped with ``POST /unload_lora_adapter {lora_name}``
(answers ``{success, error_message, loaded_adapters}``). The server must run with ``--enable-lora`` and
a ``--max-lora-rank`` / ``--lora-target-modules`` that cover the adapter. ``lora_sync="merged"``: the
adapters are folded into the base (W + alpha/r B A) and the full weights go out as without LoRA.
"""

from __future__ import annotations

import base64
import io
from multiprocessing.reduction import ForkingPickler
from typing import Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lightning_rl.core.lora import adapter_state, is_lora, merged_state_dict, save_adapter
from lightning_rl.core.models import is_vision_language

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


def checkpoint_names(policy: nn.Module, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A vision-language policy's weights named as its checkpoint files name them, which SGLang's loader reads
    (transformers renames some on load, e.g. Qwen2-VL's ``model.layers`` is ``model.language_model.layers`` in memory;
    ``save_pretrained`` names them back, and so does this)."""
    if not is_vision_language(getattr(policy, "config", None)):
        return state
    from transformers.core_model_loading import revert_weight_conversion

    return revert_weight_conversion(policy, state)


def tensor_buckets(policy: nn.Module, bucket_bytes: int) -> Iterator[list[tuple[str, Tensor]]]:
    """The policy's weights as ``(name, tensor)`` lists of about ``bucket_bytes`` each (one request per bucket)."""
    bucket: list[tuple[str, Tensor]] = []
    size = 0
    for name, tensor in checkpoint_names(policy, merged_state_dict(policy) if is_lora(policy) else policy.state_dict()).items():
        if type(tensor) is not Tensor:
            raise ValueError(
                f"SGLangRollout weight_sync='tensor' needs plain (unsharded) tensors, but '{name}' is a {type(tensor).__name__}; "
                "use weight_sync='disk' with sharded (FSDP) policies"
            )
        bucket.append((name, tensor.detach()))
        size += tensor.numel() * tensor.element_size()
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


@torch.no_grad()
def tensor_payloads(policy: nn.Module, bucket_bytes: int, tp_size: int, weight_version: str) -> Iterator[dict]:
    """``/update_weights_from_tensor`` request bodies; the last one carries the new ``weight_version``."""
    buckets = list(tensor_buckets(policy, bucket_bytes))
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


def push_tensors(client: SGLangClient, url: str, policy: nn.Module, version: str, bucket_bytes: int, abort: bool = False) -> None:
    """One ``/begin_weight_update`` ... ``/end_weight_update`` session of ``/update_weights_from_tensor`` requests."""
    info = client.request(url, "/get_server_info", method="GET")
    tp_size = int(info.get("tp_size", 1)) if isinstance(info, dict) else 1  # server_args.tp_size
    client.request(url, "/begin_weight_update", {}, check=succeeded(url))
    try:
        for i, body in enumerate(tensor_payloads(policy, bucket_bytes, tp_size, version)):
            body["abort_all_requests"] = abort and i == 0
            client.request(url, "/update_weights_from_tensor", body, check=succeeded(url))
    finally:
        client.request(url, "/end_weight_update", {}, check=succeeded(url))


def save_adapter_version(policy: nn.Module, directory: str) -> None:
    """Write the policy's adapter (peft format) to ``directory``; rank 0 writes, every rank gathers (FSDP2 shards)."""
    state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in adapter_state(policy).items()}
    if rank() == 0:
        save_adapter(policy, directory, state)


def push_adapter(client: SGLangClient, urls: list[str], directory: str, name: str, previous: str | None) -> None:
    """Load the adapter at ``directory`` as ``name`` on every server, then unload ``previous``."""
    for url in urls:

        def check(answer, url=url) -> None:
            if isinstance(answer, dict) and answer.get("success") is False:
                raise SGLangError(
                    f"SGLang server at {url} refused LoRA adapter {name!r}: {answer.get('error_message')}. It must run with --enable-lora "
                    "and --max-lora-rank / --lora-target-modules covering the policy's lora spec, or set lora_sync: merged"
                )

        client.request(url, "/load_lora_adapter", {"lora_name": name, "lora_path": directory}, check=check)
        if previous is not None:
            client.request(url, "/unload_lora_adapter", {"lora_name": previous}, check=check)


def flush_caches(client: SGLangClient, urls: list[str]) -> None:
    """``POST /flush_cache``; SGLang answers 400 while requests still run, so 400 is retried."""
    for url in urls:
        client.request(url, "/flush_cache", retry_statuses=(400, *RETRY_STATUSES))


def succeeded(url: str):
    def check(answer) -> None:
        if isinstance(answer, dict) and answer.get("success") is False:
            raise SGLangError(f"SGLang server at {url} refused the weight update: {answer.get('message')}")

    return check
