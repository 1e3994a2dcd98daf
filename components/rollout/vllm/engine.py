"""`VLLMEngine`: the server layer's engine protocol over vLLM 0.32's HTTP API (its OpenAI-compatible server with the
scale-out and dev routes, `launch`).

generate      ``POST /inference/v1/generate`` (`generation`)
score         the same with ``prompt_logprobs: k`` (given tokens' log-probs, raw, and the top k at each position)
push          disk: ``/collective_rpc {method: reload_weights, kwargs: {weights_path}}`` (an in-place reload from a
              safetensors folder) and ``/update_weight_version``; distributed: ``/init_weight_transfer_engine`` once,
              then ``/start_weight_update``, ``/update_weights`` per bucket, ``/finish_weight_update {weight_version}``
              through lightning_rl's transfer engine (`transfer`). Both while the servers are paused (``/pause?mode=
              wait``, or ``abort`` for partial rollouts; ``/resume``): vLLM loads in place and would otherwise sample
              from a half-loaded model. Pausing in those modes also clears the prefix cache, which a weight update does
              not (KV of the old weights would be reused).
adapters      ``/v1/load_lora_adapter {lora_name, lora_path}`` (a peft folder: vLLM loads no adapter from memory, so
              the adapter is written to one first), ``/v1/unload_lora_adapter``; ``"model": <name>`` samples with it
checksums     ``POST /weight_checker {action: checksum}`` -> ``{checksums: {"dp0:pp0:pcp0:tp0:<name>": sha256}}``: each
              parameter as every worker holds it, keyed by the worker's rank (``v1/worker/gpu_worker.py``'s
              ``_weight_checksum_prefix``: data-parallel index, pipeline, context- and tensor-parallel ranks) and the
              name (q/k/v fused in ``qkv_proj``, gate/up in ``gate_up_proj``, the embedding padded to 64 rows,
              a mixture of experts' experts in ``experts.routed_experts.w13_weight`` and
              ``w2_weight``, with LoRA enabled under ``<layer>.base_layer.``)
health        ``GET /health``; at set-up ``GET /server_info?config_format=json``: ``--logprobs-mode processed_logprobs``,
              and ``--weight-transfer-config`` for ``weight_sync: distributed``, or one line naming the flag
served        ``GET /v1/models`` (``root``: the checkpoint it loaded), checked against the policy
"""

from __future__ import annotations

import json
import shutil
import tempfile
import weakref
from pathlib import Path

from safetensors.torch import save_file
from torch import Tensor

from ..server.engine import Engine, expert_fusions
from ..server.group import GroupEndpoints
from ..server.launch import Command
from ..server.samples import Answer, Request
from ..server.session import paused
from ..server.settings import WeightPush
from ..server.verify import Checksums
from . import generation, launch
from .client import VLLMClient, VLLMError
from .transfer import TransferGroups

EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # sha256 of no bytes


class VLLMEngine(Engine):
    client_type = VLLMClient
    model_key = "model"
    fusions = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
               "up_proj": "gate_up_proj", **expert_fusions("routed_experts.")}  # fmt: skip

    def __init__(self, client: VLLMClient):
        super().__init__(client)
        self._adapter_dir: str | None = None

    @classmethod
    def command(cls, launch_args: dict, python: str | None) -> Command:
        return launch.command(launch_args, python)

    def health(self, url: str) -> None:
        self.client.request(url, "/health", method="GET")

    def generate(self, url: str, request: Request, adapter: str | None, keep_aborted: bool) -> list[Answer]:
        return generation.generate(self.client, url, request, adapter, keep_aborted)

    def score(self, url, prompt, continuation, images, adapter, top_k=0):
        if images:
            raise VLLMError(f"vLLM server at {url}: prompts with images are not sent to vLLM by this rollout yet")
        return generation.score(self.client, url, prompt, continuation, adapter, top_k)

    def check_setup(self, url: str, push: WeightPush) -> None:
        """Refuse a server whose sampled log-probs are not those of the distribution it samples from, or that cannot
        take a ``distributed`` push (its configuration, ``GET /server_info?config_format=json``: dev mode)."""
        answer = self.client.request(url, "/server_info?config_format=json", method="GET", retries=0)
        config = answer.get("vllm_config") if isinstance(answer, dict) else None
        if not isinstance(config, dict):
            raise self.client.fail(
                url,
                f": /server_info answered no configuration ({str(answer)[:200]}): start it with VLLM_SERVER_DEV_MODE=1",
            )
        missing = []
        mode = (config.get("model_config") or {}).get("logprobs_mode")
        if mode != "processed_logprobs":
            missing.append(
                f"--logprobs-mode processed_logprobs (it returns {mode}, not the log-probs of the distribution it "
                "samples from at the run's temperature, which the off-policy correction reads)"
            )
        transfer = config.get("weight_transfer_config") or {}
        if push.weight_sync == "distributed" and transfer.get("backend") != "lightning_rl":
            missing.append(
                f'--weight-transfer-config \'{{"backend": "lightning_rl"}}\' (it has {transfer or None}; '
                "weights.weight_sync: distributed pushes through it, with the plugin on its PYTHONPATH)"
            )
        if missing:
            raise self.client.fail(
                url,
                f" was started without {' and '.join(missing)}. Start it as the vLLM rollout's launch does, or set "
                "servers.launch instead of servers.urls",
            )

    # ------------------------------------------------------------------ weights
    # /finish_weight_update names the version; a failed push's updates are finished before the groups close
    group_endpoints = GroupEndpoints(
        "/start_weight_update", "/finish_weight_update", "/weight_info", version_at_end=True, end_before_leaving=True
    )

    def push_folder(self, urls: list[str], folder: str, version: int, abort: bool) -> None:
        if not any(Path(folder).glob("*.safetensors")):  # vLLM would leave its model on the meta device, then die
            raise VLLMError(f"vLLM rollout: no *.safetensors in {folder} to load")
        with paused(self, urls, abort):
            for url in urls:
                rpc = {"method": "reload_weights", "kwargs": {"weights_path": folder}}
                self.client.request(url, "/collective_rpc", rpc, retries=0)
                self.client.request(url, "/update_weight_version", {"new_version": str(version)}, retries=0)

    def pause(self, urls: list[str], abort: bool) -> None:
        self.each(urls, f"/pause?mode={'abort' if abort else 'wait'}", {})

    def resume(self, urls: list[str]) -> None:
        self.each(urls, "/resume", {})

    def flush_cache(self, urls: list[str]) -> None:
        self.each(urls, "/reset_prefix_cache", {})

    def load_adapter(
        self, urls: list[str], name: str, config: dict, tensors: dict[str, Tensor], push: WeightPush
    ) -> None:
        folder = self._adapter_folder(name, push.weight_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "adapter_config.json").write_text(json.dumps(config))
        save_file({k: t.contiguous() for k, t in tensors.items()}, str(folder / "adapter_model.safetensors"))
        for url in urls:
            try:
                self.client.request(url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})
            except VLLMError as err:
                raise VLLMError(
                    f"vLLM server at {url} refused LoRA adapter {name!r} ({err}). It must run with --enable-lora and a "
                    "--max-lora-rank covering the policy's lora rank (launch: {enable_lora: true, max_lora_rank: 16}), "
                    "or set weights.lora_sync: merged"
                ) from None

    def unload_adapter(self, urls: list[str], name: str, push: WeightPush) -> None:
        for url in urls:
            self.client.request(url, "/v1/unload_lora_adapter", {"lora_name": name})
        shutil.rmtree(self._adapter_folder(name, push.weight_dir), ignore_errors=True)

    def checksums(self, url: str) -> Checksums:
        answer = self.client.request(url, "/weight_checker", {"action": "checksum"})
        checksums = answer.get("checksums") if isinstance(answer, dict) else None
        if not checksums:
            raise VLLMError(f"vLLM server at {url}: /weight_checker answered no checksums: {str(answer)[:300]}")
        per_name: Checksums = {}
        for key, digest in checksums.items():
            rank, _, name = key.rpartition(":")  # "dp0:pp0:pcp0:tp0:<name>"
            per_name.setdefault(name, {})[rank] = str(digest)
        empty = sorted(name for name, digests in per_name.items() if EMPTY in digests.values())
        if empty:
            raise VLLMError(
                f"vLLM server at {url}: its /weight_checker hashes no bytes for {empty[:3]} (vLLM's CPU build hands "
                "linear weights to oneDNN and empties them), so a push cannot be verified exactly. Start it with "
                "LIGHTNING_RL_VLLM_PLAIN_LINEAR=1 and the plugin on its PYTHONPATH (launch: does both), or set "
                "verify.checksums: false"
            )
        return per_name

    def close(self) -> None:
        super().close()
        if self._adapter_dir is not None:
            shutil.rmtree(self._adapter_dir, ignore_errors=True)
            self._adapter_dir = None

    # ------------------------------------------------------------------ parts
    def _adapter_folder(self, name: str, weight_dir: str | None) -> Path:
        """Where an adapter is written for the servers to read: under ``weight_dir`` (servers on other hosts) or a
        temporary folder of this process."""
        if weight_dir is not None:
            return Path(weight_dir) / "adapters" / name
        if self._adapter_dir is None:
            self._adapter_dir = tempfile.mkdtemp(prefix="lightning_rl_vllm_adapters_")
            weakref.finalize(self, shutil.rmtree, self._adapter_dir, ignore_errors=True)
        return Path(self._adapter_dir) / name

    def open_group(self, urls: list[str], backend: str, push: WeightPush) -> TransferGroups:
        return TransferGroups(self.client, urls, backend, push.master_address, push.master_port)
