"""`VLLMRollout` without a server: how a server is launched (flags, environment, plugin, interpreter), the request and
answer mapping, and the settings refused at construction. Against a real vLLM server: test_rollout_contract.py."""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from dataclasses import replace

import pytest

from components.rollout import VLLMRollout
from components.rollout.server.samples import Request
from components.rollout.server.settings import Servers, WeightPush
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
    assert sampling_params(replace(request, ignore_eos=True))["ignore_eos"] is True
    choice = {"index": 0, "finish_reason": "abort", "token_ids": [7, 9],
              "logprobs": {"content": [{"token_id": 7, "logprob": -0.5}, {"token_id": 9, "logprob": -1.5}]},
              "weight_versions": [{"version": "3", "start": 0, "end": 2}]}  # fmt: skip
    assert _parse("http://h:1", choice) == ([7, 9], [-0.5, -1.5], "abort", "3", None, None)  # no mask, no routes
    choice["logprobs"]["content"][1]["logprob"] = -9999.0  # vLLM's stand-in for -inf / NaN
    with pytest.raises(VLLMError, match="non-finite"):
        _parse("http://h:1", choice)


def test_settings_vllm_does_not_offer_are_refused_at_construction(monkeypatch):
    import torch

    with pytest.raises(ValueError, match="temperature 2.5 is above vLLM's limit"):
        VLLMRollout(temperature=2.5, servers=Servers(urls=("http://h:1",)))
    with pytest.raises(ValueError, match="release_memory is not offered"):
        VLLMRollout(servers=Servers(urls=("http://h:1",)), weights=WeightPush(release_memory=True))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="weight_sync: tensor .* is not offered for vLLM"):
        VLLMRollout(servers=Servers(urls=("http://h:1",)), weights=WeightPush(weight_sync="tensor"))


def test_a_recorded_sampling_mask_is_parsed_and_the_trainer_renormalises_over_it():
    """#46 item 7: with ``--return-sampling-mask`` (Model Runner V2) each choice lists, per token, the ids top-k /
    top-p / min-p left samplable. The fixture is a response serialised by vLLM 0.32's own GenerateTokensResponse
    model (tests/fixtures/vllm_sampling_mask.json); the trainer renormalises over exactly those ids, the sampled
    token's log-prob then equal to what the server reported for these logits."""
    import json
    import math
    from pathlib import Path

    import torch

    from components.rollout.server.generation import _stamp
    from components.rollout.server.samples import to_batch
    from lightning_rl.core.batch import Prompts, RolloutBatch
    from lightning_rl.core.logprobs import sampled_logprobs
    from lightning_rl.core.truncation import Truncation

    answer = json.loads((Path(__file__).parents[1] / "fixtures/vllm_sampling_mask.json").read_text())
    answers = [_parse("http://h:1", c) for c in answer["choices"]]
    assert [a.support for a in answers] == [[[8, 11, 4], [5, 9], [2]], [[8, 11, 4], [7, 3, 5, 9]]]
    engine = type("Engine", (), {"client": None})()
    samples = [_stamp(engine, "http://h:1", a, 2, True) for a in answers]
    prompts = Prompts(torch.tensor([[4, 6]]), torch.ones(1, 2, dtype=torch.long))
    batch = to_batch(prompts, samples, 2, False, [2], 0, 2)
    assert batch.sampling_support.tolist() == [
        [[8, 11, 4, -1], [5, 9, -1, -1], [2, -1, -1, -1]],
        [[8, 11, 4, -1], [7, 3, 5, 9], [-1, -1, -1, -1]],  # padding lists none
    ]
    # logits the trainer might have: at position 0, log 0.5, 0.25, 0.15, 0.1 on tokens 8, 11, 4, 6 (the rest -inf-ish)
    logits = torch.full((2, 3, 12), -30.0)
    logits[:, 0, [8, 11, 4, 6]] = torch.tensor([0.5, 0.25, 0.15, 0.1]).log()
    logits[:, 1, [5, 9, 7, 3]] = torch.tensor([0.4, 0.1, 0.3, 0.2]).log()
    logits[:, 2, 2] = 0.0
    got = sampled_logprobs(logits, batch.response_ids, 1.0, support=batch.sampling_support)
    assert got[0, :2].tolist() == pytest.approx([math.log(0.5 / 0.9), math.log(0.4 / 0.5)], abs=1e-6)
    assert got[1, :2].tolist() == pytest.approx([math.log(0.25 / 0.9), math.log(0.3 / 1.0)], abs=1e-6)
    # where nothing is reported (-1 only) the rule stands: top-k 2 keeps tokens 8 and 11 of position 0
    unreported = torch.full((1, 4), -1)
    got = sampled_logprobs(logits[1:, 0], torch.tensor([11]), support=unreported, truncation=Truncation(top_k=2))
    assert float(got) == pytest.approx(math.log(0.25 / 0.75), abs=1e-6)
    # batches of two rollouts whose kept sets differ in size concatenate (-1 padded)
    assert RolloutBatch.cat([batch.select(slice(0, 1)), batch]).sampling_support.shape == (3, 3, 4)
    choice = answer["choices"][0]
    choice["sampling_mask"][1] = [9]  # the sampled token 5 outside its own kept set
    with pytest.raises(VLLMError, match="sampling_mask lists 3 kept sets for 3 tokens, or a sampled token outside"):
        _parse("http://h:1", choice)
