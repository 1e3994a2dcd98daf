"""SGLangRollout with a LoRA policy: the adapter alone goes to the server (or the merged weights, when asked)."""

from __future__ import annotations

import pytest
import torch

from components.rollout.server.settings import Servers, WeightPush
from components.rollout.sglang.client import SGLangClient, SGLangError
from components.rollout.sglang.weights import push_tensors
from lightning_rl.core.logprobs import policy_logprobs
from lightning_rl.core.lora import LoraSpec
from lightning_rl.core.models import ModelSpec, load_causal_lm
from tests.helpers import prompts as make_prompts
from tests.support.sglang import server_logprobs_match


@pytest.fixture
def lora_policy(tiny_model_path):
    return load_causal_lm(
        ModelSpec(
            path=tiny_model_path, lora=LoraSpec(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
        )
    )


def _step(policy, batch) -> None:
    """One large SGD step on the adapters, so the served distribution must move with them."""
    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=20.0)
    (-(policy_logprobs(policy, batch, 1.0)[0] * batch.response_mask).sum()).backward()
    optimizer.step()


def test_adapter_sync_from_memory_makes_the_server_sample_from_the_updated_adapter(
    server, lora_policy, prompts, make_rollout, tmp_path, tiny_model_path
):
    rollout = make_rollout(
        group_size=4,
        max_new_tokens=8,
        temperature=1.0,
        servers=Servers(urls=(server.url,)),
        weights=WeightPush(weight_dir=str(tmp_path)),
    )
    batch = rollout.generate(
        make_prompts(*prompts), lora_policy
    )  # first sync: adapter v1 (B = 0, the base's distribution)
    _step(lora_policy, batch)
    rollout.sync_weights(lora_policy)

    assert "/update_weights_from_disk" not in server.calls and "/load_lora_adapter" not in server.calls
    assert server.calls.count("/load_lora_adapter_from_tensors") == 2 and not list(
        tmp_path.iterdir()
    )  # no folder written
    v2 = rollout.pusher.adapters.name(2)
    assert list(server.adapters) == [v2] and rollout.weight_version == 2  # v1 was unloaded
    batch = rollout.generate(make_prompts(*prompts), lora_policy)
    assert server.generate_calls[-1]["lora_path"] == v2 and set(batch.versions.tolist()) == {2}
    assert server_logprobs_match(lora_policy, batch, 1.0) < 1e-5
    base = load_causal_lm(ModelSpec(path=tiny_model_path))
    assert server_logprobs_match(base, batch, 1.0) > 1e-2  # the step moved the policy: the adapter sync mattered


def test_the_server_checks_every_adapter_tensor_it_received(server, lora_policy, make_rollout, monkeypatch):
    """expected_checksums (sha256 of each tensor as sent) let the server refuse an adapter damaged on the way."""
    from components.rollout.sglang import adapters

    monkeypatch.setattr(adapters, "sha256", lambda tensor: "0" * 64)
    rollout = make_rollout(servers=Servers(urls=(server.url,)))
    with pytest.raises(SGLangError, match=r"refused LoRA adapter 'policy-[0-9a-f]{8}-v1'.*MISMATCH"):
        rollout.sync_weights(lora_policy)
    assert not server.adapters


def test_merged_sync_pushes_full_weights_with_the_adapters_folded_in(
    server, lora_policy, prompts, make_rollout, tmp_path
):
    rollout = make_rollout(
        group_size=4,
        max_new_tokens=8,
        temperature=1.0,
        servers=Servers(urls=(server.url,)),
        weights=WeightPush(weight_dir=str(tmp_path), lora_sync="merged"),
    )
    _step(lora_policy, rollout.generate(make_prompts(*prompts), lora_policy))
    rollout.sync_weights(lora_policy)
    assert "/load_lora_adapter" not in server.calls and not server.adapters and server.weight_version == "2"
    batch = rollout.generate(make_prompts(*prompts), lora_policy)
    assert "lora_path" not in server.generate_calls[-1]
    assert server_logprobs_match(lora_policy, batch, 1.0) < 1e-5


def test_tensor_sync_of_a_lora_policy_sends_merged_weights_under_plain_names(
    server, lora_policy, prompts, make_rollout
):
    rollout = make_rollout(
        group_size=2, max_new_tokens=8, servers=Servers(urls=(server.url,)), weights=WeightPush(lora_sync="merged")
    )
    _step(lora_policy, rollout.generate(make_prompts(*prompts), lora_policy))
    push_tensors(
        SGLangClient(30.0, 0, 0.0), server.url, lora_policy, "2", bucket_bytes=1 << 20
    )  # CPU tensors: this in-process server only
    assert server_logprobs_match(lora_policy, rollout.generate(make_prompts(*prompts), lora_policy), 1.0) < 1e-5


def test_a_server_that_refuses_the_adapter_says_which_flags_it_needs(server, lora_policy, prompts, make_rollout):
    rollout = make_rollout(group_size=2, max_new_tokens=4, servers=Servers(urls=(server.url,)))
    server.adapters[rollout.pusher.adapters.name(1)] = server.model  # the name is taken: SGLang answers success=false
    with pytest.raises(SGLangError, match="refused LoRA adapter 'policy-.*-v1'.*--enable-lora.*lora_sync: merged"):
        rollout.generate(make_prompts(*prompts), lora_policy)


def test_asynchronous_training_keeps_the_adapters_requests_in_flight_may_use(
    server, lora_policy, prompts, make_rollout
):
    """With max_staleness k, a round may still sample with the adapter of k versions ago: k + 1 stay loaded."""
    rollout = make_rollout(group_size=2, max_new_tokens=4, servers=Servers(urls=(server.url,)))
    rollout.prepare(lora_policy, max_staleness=2)  # v1
    for _ in range(3):
        _step(lora_policy, rollout.generate(make_prompts(*prompts), lora_policy))
        rollout.sync_weights(lora_policy)
    names = [rollout.pusher.adapters.name(v) for v in (2, 3, 4)]
    assert list(server.adapters) == names and rollout.pusher.adapters.current == names[-1]
    rollout.close()
    assert not server.adapters  # a server that outlives the run keeps none of its adapters


def test_closing_beside_a_server_that_is_gone_warns_once_and_keeps_the_runs_outcome(
    server, lora_policy, prompts, make_rollout
):
    """The adapters cannot be unloaded from a server that died: one warning naming them, after one request's retries
    (not one per adapter), and close returns."""
    rollout = make_rollout(group_size=2, max_new_tokens=4, servers=Servers(urls=(server.url,), max_retries=1))
    rollout.prepare(lora_policy, max_staleness=1)  # v1; two adapters stay loaded
    _step(lora_policy, rollout.generate(make_prompts(*prompts), lora_policy))
    rollout.sync_weights(lora_policy)
    names = [rollout.pusher.adapters.name(v) for v in (1, 2)]
    assert list(server.adapters) == names
    server.stop()
    unloads = server.calls.count("/unload_lora_adapter")
    with pytest.warns(UserWarning, match=r"LoRA adapters \[.*-v1', .*-v2'\] were not unloaded") as said:
        rollout.close()
    assert len([w for w in said if "not unloaded" in str(w.message)]) == 1
    assert server.calls.count("/unload_lora_adapter") == unloads and not rollout.pusher.adapters.loaded
