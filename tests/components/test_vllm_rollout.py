"""`VLLMRollout` without a server: how a server is launched (flags, environment, plugin, interpreter), the request and
answer mapping, and the settings refused at construction. Against a real vLLM server: test_rollout_contract.py."""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys

import pytest

from components.rollout import VLLMRollout
from components.rollout.server.samples import Request
from components.rollout.vllm import VLLMError
from components.rollout.vllm.environment import MADE, VARIABLE, vllm_python
from components.rollout.vllm.generation import _parse, sampling_params
from components.rollout.vllm.launch import PLUGIN, command


def test_a_launch_adds_what_the_rollout_needs_and_keeps_what_was_given(monkeypatch):
    monkeypatch.setenv(VARIABLE, sys.executable)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    launched = command(
        {"model": "/m", "dtype": "float32", "enforce_eager": True, "logprobs_mode": "raw_logprobs"}, None
    )
    argv = launched.argv
    assert argv[:5] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    flags = " ".join(argv[5:])
    assert "--dtype float32 --enforce-eager" in flags and "--enable-scale-out" in flags
    assert "--logprobs-mode raw_logprobs" in flags  # given: kept
    assert json.loads(argv[argv.index("--weight-transfer-config") + 1]) == {"backend": "lightning_rl"}
    assert launched.health_path == "/health" and launched.url == f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
    env = launched.env
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(PLUGIN)
    assert env["VLLM_SERVER_DEV_MODE"] == env["LIGHTNING_RL_VLLM_PLAIN_LINEAR"] == env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    small = command({"model_path": "/m", "kv_cache_memory_bytes": 2**26}, None)
    assert "VLLM_CPU_KVCACHE_SPACE" not in small.env and small.argv[4] == "/m"  # vLLM refuses both sizes at once
    with pytest.raises(ValueError, match="launch needs model"):
        command({"dtype": "float32"}, None)


def test_the_plugin_is_found_through_its_entry_point_on_vllms_path():
    found = [e for d in importlib.metadata.distributions(path=[str(PLUGIN)]) for e in d.entry_points]
    assert [(e.group, e.name, e.value) for e in found] == [
        ("vllm.general_plugins", "lightning_rl", "lightning_rl_vllm:register")
    ]
    assert (PLUGIN / "lightning_rl_vllm" / "transfer_engine.py").exists()


def test_a_missing_environment_is_one_line_naming_the_three_places(monkeypatch, tmp_path):
    monkeypatch.delenv(VARIABLE, raising=False)
    with pytest.raises(FileNotFoundError) as missing:
        vllm_python(str(tmp_path / "nowhere" / "python"))
    message = str(missing.value)
    assert "\n" not in message and "nowhere" in message
    assert "launch_python" in message and VARIABLE in message and "make vllm-env" in message and str(MADE) in message
    monkeypatch.setenv(VARIABLE, sys.executable)
    assert vllm_python() == sys.executable and vllm_python(sys.executable) == sys.executable


def test_requests_and_answers_map_to_vllms_fields():
    request = Request([4, 5], n=3, temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=6, stop_token_ids=[9])
    assert sampling_params(request) == {"n": 3, "temperature": 0.7, "top_p": 0.9, "top_k": 0, "max_tokens": 6,
                                        "stop_token_ids": [9], "logprobs": 0}  # fmt: skip
    choice = {"index": 0, "finish_reason": "abort", "token_ids": [7, 9],
              "logprobs": {"content": [{"token_id": 7, "logprob": -0.5}, {"token_id": 9, "logprob": -1.5}]},
              "weight_versions": [{"version": "3", "start": 0, "end": 2}]}  # fmt: skip
    assert _parse("http://h:1", choice) == ([7, 9], [-0.5, -1.5], "abort", "3", None)  # no routes asked
    choice["logprobs"]["content"][1]["logprob"] = -9999.0  # vLLM's stand-in for -inf / NaN
    with pytest.raises(VLLMError, match="non-finite"):
        _parse("http://h:1", choice)


def test_settings_vllm_does_not_offer_are_refused_at_construction(monkeypatch):
    import torch

    with pytest.raises(ValueError, match="temperature 2.5 is above vLLM's limit"):
        VLLMRollout(base_url="http://h:1", temperature=2.5)
    with pytest.raises(ValueError, match="release_memory is not offered"):
        VLLMRollout(base_url="http://h:1", release_memory=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="weight_sync: tensor .* is not offered for vLLM"):
        VLLMRollout(base_url="http://h:1", weight_sync="tensor")
