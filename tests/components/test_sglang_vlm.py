"""SGLangRollout with a vision-language policy, against the loopback server (tests/fixtures/sglang_server.py) over a
tiny Qwen2-VL: the images travel with the token ids as SGLang's native ``image_data``, the server's log-probs (its
transformers generate, with transformers' own multimodal positions) equal the trainer's recomputation, and both weight
syncs push the vision-language weights under the names SGLang's loader reads."""

from __future__ import annotations

import base64
import io
from dataclasses import replace

import pytest
import torch
from PIL import Image

from components.rollout import SGLangRollout
from components.rollout.server.settings import Servers, Verification, WeightPush
from components.rollout.sglang.client import SGLangClient
from components.rollout.sglang.weights import push_tensors
from lightning_rl.core.logprobs import policy_logprobs
from lightning_rl.core.models import ModelSpec, load_causal_lm, load_tokenizer
from tests.fixtures.sglang_server import FakeSGLangServer
from tests.helpers import image_prompts, pictures

TOL = 1e-5


@pytest.fixture
def server(tiny_vlm_path):
    srv = FakeSGLangServer(tiny_vlm_path).start()
    yield srv
    srv.stop()


@pytest.fixture
def policy(tiny_vlm_path):
    return load_causal_lm(ModelSpec(path=tiny_vlm_path))


@pytest.fixture
def prompts(tiny_vlm_path):
    return image_prompts(tiny_vlm_path, [
        ("count the shapes in both", pictures((84, 56, (0, 150, 0)), (28, 56, (90, 90, 90)))),
        ("how many?", pictures((56, 56, (200, 0, 0)))),
        ("no image here", []),
    ])  # fmt: skip


@pytest.fixture
def make_rollout(tiny_vlm_path):
    made = []

    def make(servers: Servers, verify: Verification = Verification(every=0), **kwargs):
        # unverified unless asked: the probe's requests would be counted among the generate calls
        rollout = SGLangRollout(servers=replace(servers, backoff=0.01), verify=verify, **kwargs)
        rollout.setup(load_tokenizer(tiny_vlm_path))
        made.append(rollout)
        return rollout

    yield make
    for rollout in made:
        rollout.close()


def mismatch(policy, batch) -> float:
    with torch.no_grad():
        trainer = policy_logprobs(policy, batch, 1.0)[0] * batch.response_mask
    return float((trainer - batch.rollout_logprobs).abs().max())


def decoded(entry: str) -> Image.Image:
    assert entry.startswith("data:image/png;base64,")
    return Image.open(io.BytesIO(base64.b64decode(entry.split(",", 1)[1])))


def test_images_go_with_the_token_ids_as_sglang_takes_them(server, policy, prompts, make_rollout):
    rollout = make_rollout(
        group_size=3, max_new_tokens=5, servers=Servers(urls=(server.url,), max_concurrency=1)
    )  # requests in order
    batch = rollout.generate(prompts, policy)
    calls = server.generate_calls
    assert [c["input_ids"] for c in calls] == [
        row[m.bool()].tolist() for row, m in zip(prompts.prompt_ids, prompts.prompt_mask)
    ]
    # n > 1: a batch of one on the server, so one list of images per prompt; a text prompt sends none
    assert [len(c["image_data"]) for c in calls[:2]] == [1, 1] and [len(c["image_data"][0]) for c in calls[:2]] == [
        2,
        1,
    ]
    assert "image_data" not in calls[2]
    sent = [decoded(entry) for entry in calls[0]["image_data"][0]]
    assert [im.size for im in sent] == [(84, 56), (28, 56)]
    assert list(sent[0].getdata()) == list(prompts.images[0][0].getdata())  # lossless: the pixels the trainer read
    assert batch.images is not None and batch.images[0] is prompts.images[0] and len(batch.image_inputs) == 9
    # n = 1 (greedy validation): a single request takes the flat list of its images
    rollout.generate(prompts, policy, replace(rollout.params, greedy=True))
    assert [len(c["image_data"]) for c in calls[3:5]] == [2, 1] and isinstance(calls[3]["image_data"][0], str)


def test_server_logprobs_equal_the_trainers(server, policy, prompts, make_rollout):
    rollout = make_rollout(group_size=4, max_new_tokens=8, servers=Servers(urls=(server.url,)))
    torch.manual_seed(0)
    batch = rollout.generate(prompts, policy)
    assert batch.response_mask.sum() > 12
    assert mismatch(policy, batch) < TOL


@pytest.mark.parametrize("weight_sync", ["disk", "tensor"])
def test_weight_sync_serves_the_updated_vision_language_policy(
    server, policy, prompts, make_rollout, tmp_path, weight_sync
):
    """The push names the weights as the checkpoint files do (transformers renames a VLM's in memory); the probe checks it.
    ``tensor``: the tensor payloads to this in-process server (CUDA IPC, which carries them to another process, needs a GPU)."""
    rollout = make_rollout(
        group_size=4,
        max_new_tokens=6,
        servers=Servers(urls=(server.url,)),
        weights=WeightPush(weight_dir=str(tmp_path)),
        verify=Verification(every=1),
    )
    batch = rollout.generate(prompts, policy)
    old = {k: v.clone() for k, v in policy.state_dict().items()}
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    if weight_sync == "disk":
        rollout.sync_weights(policy)
    else:
        push_tensors(SGLangClient(30.0, 0, 0.0), server.url, policy, "2", bucket_bytes=1 << 16)
    assert server.weight_version == "2"
    batch = rollout.generate(prompts, policy)
    assert mismatch(policy, batch) < TOL
    stale = load_causal_lm(ModelSpec(path=server_path(server)))
    stale.load_state_dict(old)
    assert mismatch(stale, batch) > 1e-3  # the push changed the samples' log-probs: it reached the server


def server_path(server) -> str:
    return server.model.name_or_path


def test_tensor_sync_names_weights_as_the_checkpoint_does(policy):
    from components.rollout.sglang.weights import tensor_buckets

    names = [name for bucket in tensor_buckets(policy, 1 << 30) for name, _ in bucket]
    assert any(n.startswith("model.layers.") for n in names) and any(n.startswith("visual.") for n in names)
    assert not any(n.startswith(("model.language_model.", "model.visual.")) for n in names)
