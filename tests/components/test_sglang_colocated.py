"""SGLangRollout with its server in a process of its own on the trainer's device (colocated), started by the rollout
through ``launch`` as SGLang would be (here the loopback stand-in, tests/fixtures/sglang_server.py).

On a GPU the weights go over as CUDA IPC handles (``weight_sync: tensor``: the server maps the trainer's memory) and
the server gives its GPU memory back between rollouts (``release_memory``). CPU tensors cannot cross into an unrelated
process by handle, so on CPU the same flow runs with disk sync; the CUDA cases run under ``pytest -m gpu``.
"""

from __future__ import annotations

import pytest
import torch

from components.rollout import SGLangRollout
from components.rollout.server.settings import Servers, WeightPush
from lightning_rl.core.logprobs import policy_logprobs
from lightning_rl.core.models import ModelSpec, load_causal_lm
from tests.fixtures.sglang_server import fake_sglang_package
from tests.helpers import needs_cuda, pythonpath
from tests.helpers import prompts as make_prompts
from tests.support.sglang import server_logprobs_match

DEVICES = [
    pytest.param("cpu", "disk", id="cpu-disk"),
    pytest.param("cuda", "tensor", id="cuda-ipc", marks=[pytest.mark.gpu, needs_cuda]),
]


@pytest.fixture
def launch(tmp_path, monkeypatch, tiny_model_path, make_rollout):
    """``launch(device, **rollout_kwargs)``: a rollout that starts its own server process on ``device``."""
    fake_sglang_package(tmp_path)
    monkeypatch.setenv("PYTHONPATH", pythonpath(tmp_path))
    return lambda device, **kwargs: make_rollout(
        Servers(launch={"model_path": tiny_model_path, "device": device}), **kwargs
    )


def _served_bytes(rollout: SGLangRollout) -> int:
    connection = rollout.connection
    info = connection.client.request(connection.urls[0], "/get_server_info", method="GET")
    return int(info["memory_allocated_bytes"])


@pytest.mark.slow
@pytest.mark.parametrize("device, weight_sync", DEVICES)
def test_a_colocated_server_samples_each_update_of_the_trainers_policy(
    launch, tiny_model_path, prompts, device, weight_sync
):
    policy = load_causal_lm(ModelSpec(path=tiny_model_path)).to(device)
    rollout = launch(
        device, group_size=4, max_new_tokens=8, weights=WeightPush(weight_sync=weight_sync, release_memory=True)
    )
    asked = make_prompts(*prompts).to(device)
    batch = rollout.generate(asked, policy)
    assert batch.response_ids.device.type == device and set(batch.versions.tolist()) == {1}
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    (-(policy_logprobs(policy, batch, 1.0)[0] * batch.response_mask).sum()).backward()
    optimizer.step()
    rollout.sync_weights(policy)  # resumes the released server, pushes, releases again
    batch = rollout.generate(asked, policy)
    assert set(batch.versions.tolist()) == {2}
    assert server_logprobs_match(policy, batch, 1.0) < 1e-4  # the server samples the updated policy


@pytest.mark.gpu
@pytest.mark.slow
@needs_cuda
def test_the_colocated_servers_gpu_memory_is_given_back_between_rollouts(launch, tiny_model_path, prompts):
    policy = load_causal_lm(ModelSpec(path=tiny_model_path)).cuda()
    model_bytes = sum(p.numel() * p.element_size() for p in policy.parameters())  # tied weights counted once
    rollout = launch(
        "cuda", group_size=2, max_new_tokens=4, weights=WeightPush(weight_sync="tensor", release_memory=True)
    )
    loaded = _served_bytes(rollout)
    assert loaded >= model_bytes  # the server's model is on the GPU
    asked = make_prompts(*prompts).to("cuda")
    rollout.generate(asked, policy)
    assert _served_bytes(rollout) <= loaded - model_bytes  # released after the rollout: the model left the GPU
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    rollout.sync_weights(policy)  # resume, push by CUDA IPC, release
    assert _served_bytes(rollout) <= loaded - model_bytes
    batch = rollout.generate(asked, policy)  # resumed again: the pushed weights survived the round trip off the GPU
    assert server_logprobs_match(policy, batch, 1.0) < 1e-4
