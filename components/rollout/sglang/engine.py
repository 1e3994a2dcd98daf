"""`SGLangEngine`: the server layer's engine protocol over SGLang's native HTTP API (checked against SGLang 0.5.23's
``sglang/srt/entrypoints/http_server.py`` and ``managers/io_struct.py``).

generate      ``POST /generate`` (`generation`)
score         ``POST /generate`` with ``max_new_tokens: 0``, ``return_logprob``, ``logprob_start_len`` and
              ``top_logprobs_num`` (given tokens' input log-probs, raw); ``GET /model_info`` (``tokenizer_path``)
push          ``/update_weights_from_disk`` (`weights`); ``/update_weights_from_tensor`` in a
              ``/begin_weight_update`` ... ``/end_weight_update`` session (CUDA IPC, `weights`); or a process group
              (``/init_weights_update_group``, ``/update_weights_from_distributed``: `group`) while the servers are
              paused (``/pause_generation`` mode abort or retract, ``/continue_generation``)
adapters      ``/load_lora_adapter_from_tensors``, ``/unload_lora_adapter`` (`adapters`)
checksums     ``POST /weights_checker {action: checksum}`` -> ``{success, ranks: [{checksums: {name: hash},
              per_gpu_checksum, parallelism_info: {role, tp_rank, dp_rank, pp_rank, ...}}]}``: one entry per rank of
              every data-parallel replica (``managers/tokenizer_control_mixin.py`` gathers them), each parameter and
              buffer of the server's model under SGLang's own names (q/k/v fused in ``qkv_proj``, gate/up in
              ``gate_up_proj``), hashed as held (sha256 of the bytes on CPU, a Triton hash on GPUs:
              ``sglang/srt/utils/weight_checker.py``); a speculative draft model's ranks (role ``draft...``) hold
              no weight the trainer pushes and are left out
health        ``GET /health_generate`` (runs a one-token generation)
served        ``GET /model_info`` (``model_path``, ``architectures``): the checkpoint it serves, checked against the policy
memory        ``/release_memory_occupation``, ``/resume_memory_occupation`` (``--enable-memory-saver``)
"""

from __future__ import annotations

import sys
import uuid

from torch import Tensor

from ..server.buckets import WeightBuckets
from ..server.engine import Engine, expert_fusions
from ..server.group import GroupEndpoints
from ..server.launch import Command
from ..server.ranks import rank
from ..server.samples import Answer, Request
from ..server.served import Served
from ..server.settings import WeightPush
from ..server.verify import Checksums
from . import adapters, generation, server, weights
from .client import SGLangClient, SGLangError
from .group import WeightGroup


class SGLangEngine(Engine):
    client_type = SGLangClient
    model_key = "model_path"
    fusions = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
               "up_proj": "gate_up_proj", **expert_fusions("")}  # fmt: skip

    @classmethod
    def command(cls, launch: dict, python: str | None) -> Command:
        return server.command(launch, python or sys.executable)

    def health(self, url: str) -> None:
        self.client.request(url, "/health_generate", method="GET")

    def generate(self, url: str, request: Request, adapter: str | None, keep_aborted: bool) -> list[Answer]:
        return generation.request(self.client, url, request, adapter, keep_aborted)

    def score(self, url, prompt, continuation, images, adapter, top_k=0):
        return generation.score(self.client, url, prompt, continuation, images, adapter, top_k)

    def model_path(self, url: str) -> str | None:
        info = self.client.request(url, "/model_info", method="GET", retries=0)
        return (info.get("tokenizer_path") or info.get("model_path")) if isinstance(info, dict) else None

    def served(self, url: str) -> Served:
        info = self.client.request(url, "/model_info", method="GET", retries=0)
        info = info if isinstance(info, dict) else {}
        return Served(info.get("model_path"), info.get("architectures"))

    # ------------------------------------------------------------------ weights
    # the weight_version rides on the last bucket; the trainer leaves a failed push's group before the sessions end
    group_endpoints = GroupEndpoints(
        "/begin_weight_update", "/end_weight_update", "/model_info", version_at_end=False, end_before_leaving=False
    )

    def push_folder(self, urls: list[str], folder: str, version: int, abort: bool) -> None:
        weights.push_from_disk(self.client, urls, folder, str(version), abort=abort)

    def push_buckets(
        self, urls: list[str], buckets: WeightBuckets, version: int, push: WeightPush, abort: bool, device: str
    ) -> None:
        if push.weight_sync == "tensor":
            if rank() == 0:
                weights.plain(buckets)
                for url in urls:
                    weights.send_tensors(self.client, url, buckets, str(version), abort=abort)
            return
        super().push_buckets(urls, buckets, version, push, abort, device)

    def pause(self, urls: list[str], abort: bool) -> None:
        self.each(urls, "/pause_generation", {"mode": "abort" if abort else "retract"})

    def resume(self, urls: list[str]) -> None:
        self.each(urls, "/continue_generation", {})

    def refusal_check(self, url: str):
        return weights.succeeded(url)  # SGLang refuses in its answer: {success: false, message}

    def flush_cache(self, urls: list[str]) -> None:
        weights.flush_caches(self.client, urls)

    def load_adapter(
        self, urls: list[str], name: str, config: dict, tensors: dict[str, Tensor], push: WeightPush
    ) -> None:
        adapters.push_adapter(self.client, urls, name, config, tensors)

    def unload_adapter(self, urls: list[str], name: str, push: WeightPush) -> None:
        adapters.unload_adapter(self.client, urls, name)

    def checksums(self, url: str) -> Checksums:
        answer = self.client.request(url, "/weights_checker", {"action": "checksum"}, check=weights.succeeded(url))
        ranks = (answer or {}).get("ranks") if isinstance(answer, dict) else None
        if not ranks:
            raise SGLangError(f"SGLang server at {url}: /weights_checker answered no checksums: {str(answer)[:300]}")
        per_name: Checksums = {}
        for i, entry in enumerate(ranks):
            where = entry.get("parallelism_info")
            if where is not None and where["role"] != "target":
                continue
            rank = f"dp{where['dp_rank']}:pp{where['pp_rank']}:tp{where['tp_rank']}" if where else f"rank {i}"
            for name, digest in entry["checksums"].items():
                per_name.setdefault(name, {})[rank] = str(digest)
        return per_name

    def release_memory(self, urls: list[str]) -> None:
        for url in urls:
            self.client.request(url, "/release_memory_occupation", {})

    def resume_memory(self, urls: list[str]) -> None:
        for url in urls:
            self.client.request(url, "/resume_memory_occupation", {})

    def open_group(self, urls: list[str], backend: str, push: WeightPush) -> WeightGroup:
        name = f"lightning_rl_{uuid.uuid4().hex[:12]}"  # a crashed trainer may have left its group on the servers
        per_server = backend == "gloo" if push.group_per_server is None else push.group_per_server
        return WeightGroup(self.client, urls, backend, push.master_address, push.master_port, name,
                           per_server=per_server, flush_cache=push.flush_cache)  # fmt: skip
