"""SGLangRollout with a LoRA policy: the adapter alone goes to the server (or the merged weights, when asked)."""

from __future__ import annotations

import pytest
import torch

from components.rollout import SGLangRollout
from components.rollout.sglang.client import SGLangError
from lightning_rl.core.lora import LoraSpec
from lightning_rl.core.logprobs import policy_logprobs
from lightning_rl.core.models import ModelSpec, load_causal_lm
from tests.components.test_sglang_rollout import _server_logprobs_match, make_rollout, prompts, server  # noqa: F401 (fixtures)
from tests.helpers import prompts as make_prompts


@pytest.fixture
def lora_policy(tiny_model_path):
    return load_causal_lm(ModelSpec(path=tiny_model_path, lora=LoraSpec(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])))


def _step(policy, batch) -> None:
    """One large SGD step on the adapters, so the served distribution must move with them."""
    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=20.0)
    (-(policy_logprobs(policy, batch, 1.0)[0] * batch.response_mask).sum()).backward()
    optimizer.step()


def test_adapter_sync_makes_the_server_sample_from_the_updated_adapter(server, lora_policy, prompts, make_rollout, tmp_path, tiny_model_path):
    rollout = make_rollout(base_url=server.url, group_size=4, max_new_tokens=8, temperature=1.0, weight_dir=str(tmp_path))
    batch = rollout.generate(make_prompts(*prompts), lora_policy)  # first sync: adapter v1 (B = 0, the base's distribution)
    _step(lora_policy, batch)
    rollout.sync_weights(lora_policy)

    assert "/update_weights_from_disk" not in server.calls and server.calls.count("/load_lora_adapter") == 2
    assert list(server.adapters) == ["policy-v2"] and rollout.weight_version == 2  # v1 was unloaded
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v2"] and (tmp_path / "v2" / "adapter_model.safetensors").is_file()
    batch = rollout.generate(make_prompts(*prompts), lora_policy)
    assert server.generate_calls[-1]["lora_path"] == "policy-v2" and set(batch.versions.tolist()) == {2}
    assert _server_logprobs_match(lora_policy, batch, 1.0) < 1e-5
    base = load_causal_lm(ModelSpec(path=tiny_model_path))
    assert _server_logprobs_match(base, batch, 1.0) > 1e-2  # the step moved the policy: the adapter sync mattered


def test_merged_sync_pushes_full_weights_with_the_adapters_folded_in(server, lora_policy, prompts, make_rollout, tmp_path):
    rollout = make_rollout(base_url=server.url, group_size=4, max_new_tokens=8, temperature=1.0, weight_dir=str(tmp_path), lora_sync="merged")
    _step(lora_policy, rollout.generate(make_prompts(*prompts), lora_policy))
    rollout.sync_weights(lora_policy)
    assert "/load_lora_adapter" not in server.calls and not server.adapters and server.weight_version == "2"
    batch = rollout.generate(make_prompts(*prompts), lora_policy)
    assert "lora_path" not in server.generate_calls[-1]
    assert _server_logprobs_match(lora_policy, batch, 1.0) < 1e-5


def test_tensor_sync_of_a_lora_policy_sends_merged_weights_under_plain_names(server, lora_policy, prompts, make_rollout):
    rollout = make_rollout(base_url=server.url, group_size=2, max_new_tokens=8, weight_sync="tensor", lora_sync="merged")
    _step(lora_policy, rollout.generate(make_prompts(*prompts), lora_policy))
    rollout.sync_weights(lora_policy)
    assert _server_logprobs_match(lora_policy, rollout.generate(make_prompts(*prompts), lora_policy), 1.0) < 1e-5


def test_a_server_that_refuses_the_adapter_says_which_flags_it_needs(server, lora_policy, prompts, make_rollout):
    server.adapters["policy-v1"] = server.model  # the name is taken: SGLang answers success=false
    rollout = make_rollout(base_url=server.url, group_size=2, max_new_tokens=4)
    with pytest.raises(SGLangError, match="refused LoRA adapter 'policy-v1'.*--enable-lora.*lora_sync: merged"):
        rollout.generate(make_prompts(*prompts), lora_policy)


def test_asynchronous_training_refuses_adapter_sync(lora_policy):
    """An adapter push unloads the adapter that requests in flight sample with: asynchronous runs need merged sync."""
    rollout = SGLangRollout(base_url="http://127.0.0.1:9", lora_sync="adapter")
    with pytest.raises(ValueError, match="lora_sync: merged"):
        rollout.prepare(lora_policy)
