"""A LoRA policy's adapter to SGLang from memory (``lora_sync: adapter``), no folder.

``POST /load_lora_adapter_from_tensors {lora_name, config_dict, serialized_named_tensors, expected_checksums}``
(``LoadLoRAAdapterFromTensorsReqInput``, checked against SGLang 0.5.23) loads the adapter under a new name per
version; ``/generate`` names it in ``lora_path``; ``POST /unload_lora_adapter {lora_name}`` drops an old one. Both
answer ``{success, error_message, loaded_adapters}`` (HTTP 400 when refused). The server must run with
``--enable-lora`` and a ``--max-lora-rank`` / ``--lora-target-modules`` covering the adapter.

The tensors travel by value: ``serialized_named_tensors`` holds, once per tensor-parallel rank, the base64 text of a
plain pickle of ``{name: CPU tensor}`` (names as in ``adapter_model.safetensors``), which SGLang's ``SafeUnpickler``
rebuilds through ``torch.storage._load_from_bytes``: no shared memory or CUDA IPC, so the server may be on another
host. ``expected_checksums`` (sha256 of each tensor's bytes, as SGLang's tp worker computes it) has the server check
every tensor it received before loading.
"""

from __future__ import annotations

import base64
import hashlib
import pickle

import torch
from torch import Tensor

from .client import SGLangClient, SGLangError
from .weights import tp_size

NEEDS = "It must run with --enable-lora and --max-lora-rank / --lora-target-modules covering the policy's lora spec, or set weights.lora_sync: merged"


def sha256(tensor: Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def _refused(url: str, name: str):
    def check(answer) -> None:
        if isinstance(answer, dict) and answer.get("success") is False:
            raise SGLangError(
                f"SGLang server at {url} refused LoRA adapter {name!r}: {answer.get('error_message')}. {NEEDS}"
            )

    return check


def push_adapter(client: SGLangClient, urls: list[str], name: str, config: dict, tensors: dict[str, Tensor]) -> None:
    """Load the adapter as ``name`` on every server."""
    serialized = base64.b64encode(pickle.dumps(tensors)).decode()
    checksums = {key: sha256(t) for key, t in tensors.items()}
    for url in urls:
        body = {
            "lora_name": name,
            "config_dict": config,
            "serialized_named_tensors": [serialized] * tp_size(client, url),
            "expected_checksums": checksums,
        }
        try:
            client.request(url, "/load_lora_adapter_from_tensors", body, check=_refused(url, name))
        except SGLangError as err:
            if "HTTP 400" in str(err):  # SGLang answers a refusal with 400 and the same body
                raise SGLangError(f"SGLang server at {url} refused LoRA adapter {name!r} ({err}). {NEEDS}") from None
            raise


def unload_adapter(client: SGLangClient, urls: list[str], name: str) -> None:
    for url in urls:
        client.request(url, "/unload_lora_adapter", {"lora_name": name}, check=_refused(url, name))
