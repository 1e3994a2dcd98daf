"""Launching vLLM's OpenAI-compatible server with what the rollout needs (vLLM 0.32):

- ``--enable-scale-out``: the token-in token-out ``/inference/v1/generate``;
- ``VLLM_SERVER_DEV_MODE=1``: ``/pause``, ``/resume``, the weight-transfer routes, ``/weight_checker``,
  ``/collective_rpc`` (in-place reload from disk), ``/reset_prefix_cache``;
- ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``: ``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``;
- ``--logprobs-mode processed_logprobs``: the sampled token's log-prob under the distribution it was sampled from,
  log_softmax(logits / T) (the default, ``raw_logprobs``, ignores the temperature);
- ``--weight-transfer-config {"backend": "lightning_rl"}`` and the plugin folder on ``PYTHONPATH`` (`plugin`): the
  weight-transfer engine of ``weight_sync: distributed``;
- ``LIGHTNING_RL_VLLM_PLAIN_LINEAR=1``: on the CPU build, linear layers computed from their own weights, which
  ``/weight_checker`` can then hash (the plugin's docstring says why).

On the CPU build ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache) defaults to 1 here and its threads are not pinned to
cores (``VLLM_CPU_OMP_THREADS_BIND=nobind``: a machine shared with the trainer); the environment overrides both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..server.launch import Command, free_port, server_argv
from .environment import vllm_python

PLUGIN = Path(__file__).resolve().parent / "plugin"
"""The folder vLLM's ``PYTHONPATH`` gets: the plugin package and its entry point (``*.dist-info``)."""

DEFAULTS = {
    "enable_scale_out": True,
    "logprobs_mode": "processed_logprobs",
    "weight_transfer_config": json.dumps({"backend": "lightning_rl"}),
}
ENVIRONMENT = {
    "VLLM_SERVER_DEV_MODE": "1",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
    "LIGHTNING_RL_VLLM_PLAIN_LINEAR": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
CPU_DEFAULTS = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def command(launch: dict[str, Any], launch_python: str | None) -> Command:
    """``python -m vllm.entrypoints.openai.api_server --model <model> ...`` with ``launch``'s other keys as flags."""
    args = dict(launch)
    model = args.pop("model", None) or args.pop("model_path", None)
    if not model:
        raise ValueError(
            "VLLMRollout: launch needs model, the checkpoint the server loads "
            "(e.g. launch: {model: ${model.policy.path}, dtype: float32})"
        )
    args.setdefault("host", "127.0.0.1")
    args.setdefault("port", free_port(args["host"]))
    for key, value in DEFAULTS.items():
        args.setdefault(key, value)
    env = dict(ENVIRONMENT)
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGIN), *filter(None, [os.environ.get("PYTHONPATH")])])
    for key, value in CPU_DEFAULTS.items():
        if key not in os.environ and not (key == "VLLM_CPU_KVCACHE_SPACE" and "kv_cache_memory_bytes" in args):
            env[key] = value
    python = vllm_python(launch_python)
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), *server_argv(args)]
    return Command(argv, f"http://{args['host']}:{args['port']}", "/health", env)
