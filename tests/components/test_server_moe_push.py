"""A mixture of experts' weights on their way to a server: transformers holds each layer's experts as 3-D tensors
(Qwen3-MoE's ``mlp.experts.gate_up_proj`` (E, 2I, H), ``down_proj`` (E, H, I)) and its checkpoints one tensor per
expert and projection; the pushes send the checkpoint's tensors (components/rollout/server/buckets.py), and the
verification maps them to the tensors SGLang and vLLM fuse them into (``w13_weight``, ``w2_weight``). Against the
loopback SGLang server, which loads and hashes the experts as SGLang does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from components.rollout.server.buckets import WeightBuckets, plan_buckets
from components.rollout.server.settings import Servers, Verification, WeightPush
from components.rollout.server.verify import ServerNames, checksum_finding, stale_tensors
from components.rollout.sglang import SGLangError
from components.rollout.sglang.engine import SGLangEngine
from components.rollout.vllm import VLLMError
from components.rollout.vllm.engine import VLLMEngine
from lightning_rl.core.models import ModelSpec, load_causal_lm, load_tokenizer
from tests.fixtures.sglang_server import FakeSGLangServer

LAYER = "model.layers.1.mlp.experts"


def test_each_experts_tensors_go_to_the_fused_tensor_each_engine_holds():
    served = {
        "sglang": [f"{LAYER}.w13_weight", f"{LAYER}.w2_weight", "model.layers.1.mlp.gate_up_proj.weight"],
        "vllm": [f"{LAYER}.routed_experts.w13_weight", f"{LAYER}.routed_experts.w2_weight"],
        "vllm with LoRA enabled": [f"{LAYER}.base_layer.routed_experts.w13_weight",
                                   f"{LAYER}.base_layer.routed_experts.w2_weight"],
    }  # fmt: skip
    engines = {"sglang": SGLangEngine, "vllm": VLLMEngine, "vllm with LoRA enabled": VLLMEngine}
    for engine, fusions in ((name, engine.fusions) for name, engine in engines.items()):
        names = ServerNames(served[engine], fusions)
        w13, w2 = served[engine][:2]
        for pushed in ("3.gate_proj", "3.up_proj", "12.w1", "0.w3"):  # Qwen3-MoE / OLMoE and Mixtral names
            assert names(f"{LAYER}.{pushed}.weight") == w13
        for pushed in ("7.down_proj", "7.w2"):
            assert names(f"{LAYER}.{pushed}.weight") == w2
    sglang = ServerNames(served["sglang"], SGLangEngine.fusions)
    assert sglang("model.layers.1.mlp.gate_proj.weight") == "model.layers.1.mlp.gate_up_proj.weight"  # dense: as before


def test_a_fused_tensor_that_kept_its_checksum_is_named_once_with_the_pushed_ones_it_holds():
    before = {f"{LAYER}.w13_weight": {"tp0": "1"}, f"{LAYER}.w2_weight": {"tp0": "2"}}  # {name: {rank: digest}}
    after = {f"{LAYER}.w13_weight": {"tp0": "5"}, f"{LAYER}.w2_weight": {"tp0": "2"}}
    changed = [f"{LAYER}.{e}.{p}.weight" for e in range(4) for p in ("gate_proj", "up_proj", "down_proj")]
    stale, unknown = stale_tensors(changed, before, after, SGLangEngine.fusions)
    assert unknown == [] and [p for p, _, _ in stale] == [f"{LAYER}.{e}.down_proj.weight" for e in range(4)]
    finding = checksum_finding(SGLangError, "http://s", changed, before, after, SGLangEngine.fusions)
    assert finding == (
        f"4 of the 12 tensors the trainer changed kept their checksum on the server: {LAYER}.0.down_proj.weight and 3 "
        f"more (the server's {LAYER}.w2_weight)"
    )


def test_a_name_no_fusion_maps_stops_the_push_naming_what_the_server_holds_beside_it_and_where_to_map_it():
    """The issue's report: vLLM held the experts under other names, the check said to switch verification off, and
    with it off the expert pushes never landed. The error names the server's tensors beside the unmapped one and the
    map to extend, and does not offer switching the check off."""
    held = {f"{LAYER}.routed_experts.w13_weight": {"tp0": "1"}, f"{LAYER}.routed_experts.w2_weight": {"tp0": "2"}}
    changed = [f"{LAYER}.gate_up_proj"] + [f"model.layers.1.mlp.experts.{e}.w9.weight" for e in range(6)]
    with pytest.raises(VLLMError, match=r"name none of") as caught:
        checksum_finding(VLLMError, "http://v", changed, held, held, VLLMEngine.fusions, "vllm.VLLMEngine")
    message = str(caught.value)
    assert f"['{LAYER}.gate_up_proj', " in message and "(and 2 more)" in message
    assert f"It holds ['{LAYER}.routed_experts.w13_weight', '{LAYER}.routed_experts.w2_weight'] beside" in message
    assert message.endswith("map the pushed names to the server's in vllm.VLLMEngine.fusions")
    assert "verify.checksums" not in message and "\n" not in message


@pytest.mark.parametrize("family", ["qwen3_moe", "olmoe", "mixtral"])
def test_the_buckets_hold_the_checkpoints_tensors_each_experts_in_one_bucket(family, tmp_path):
    """Names, shapes and values exactly as ``save_pretrained`` writes them; a 3-D tensor's experts never split over
    two buckets (a bucket of 4 KiB is smaller than one layer's experts)."""
    from safetensors.torch import load_file

    from tests.support.moe import save_moe

    path = save_moe(tmp_path / family, family)
    policy = load_causal_lm(ModelSpec(path=path))
    saved = load_file(str(Path(path) / "model.safetensors"))
    plan = plan_buckets(policy, 4096)
    assert [w.name for b in plan for w in b] == list(dict.fromkeys(w.name for b in plan for w in b))  # each once
    assert {w.name for b in plan for w in b} == set(saved)
    for bucket in plan:
        for w in bucket:
            assert w.shape == saved[w.name].shape and w.dtype == saved[w.name].dtype
        sources = {w.converted for w in bucket if w.converted is not None}
        for source in sources:  # every tensor converted from it is here
            assert sum(w.converted == source for b in plan for w in b) == sum(w.converted == source for w in bucket)
    experts = [w for b in plan for w in b if ".experts." in w.name]
    assert len(experts) == 2 * 4 * 3  # layers x experts x (gate, up, down)
    for bucket in WeightBuckets(policy, 4096):
        for name, tensor in bucket:
            assert torch.equal(tensor, saved[name]), name


@pytest.fixture
def moe_server(tiny_moe_path):
    server = FakeSGLangServer(tiny_moe_path).start()
    yield server
    server.stop()


def _perturb(policy, scale: float, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))


@pytest.mark.server
def test_a_stale_expert_tensor_is_caught_and_named(moe_server, tiny_moe_path):
    """The loopback server's loader leaves layer 1's down projections as they were (as SGLang's skips a name it does
    not know): the checksums name the fused tensor and the pushed ones it holds; pushed again, it serves the policy.
    (Both engines and both pushes: the contract suite on the shipped MoE, tests/components/test_rollout_contract.py.)"""
    from components.rollout import SGLangRollout

    policy = load_causal_lm(ModelSpec(path=tiny_moe_path))
    rollout = SGLangRollout(
        servers=Servers(urls=(moe_server.url,), backoff=0.01),
        weights=WeightPush(weight_sync="disk"),
        verify=Verification(tolerance=1e-3),
    )
    rollout.setup(load_tokenizer(tiny_moe_path))
    try:
        rollout.sync_weights(policy)
        _perturb(policy, 0.05, seed=1)
        moe_server.keep_stale = {f"{LAYER}.w2_weight"}
        expected = (
            rf"{re.escape(moe_server.url)} does not hold the weights just pushed \(version 2\): 4 of the \d+ tensors "
            rf"the trainer changed kept their checksum on the server: {re.escape(LAYER)}\.0\.down_proj\.weight and 3 "
            rf"more \(the server's {re.escape(LAYER)}\.w2_weight\)[.;]"
        )
        with pytest.raises(SGLangError, match=expected):
            rollout.sync_weights(policy)
        served = moe_server.model.state_dict()
        assert not torch.equal(served[f"{LAYER}.down_proj"], policy.state_dict()[f"{LAYER}.down_proj"])
        moe_server.keep_stale = set()
        _perturb(policy, 0.05, seed=2)
        rollout.sync_weights(policy)  # every expert lands: verified by checksums and probe
        for name, tensor in policy.state_dict().items():
            assert torch.equal(moe_server.model.state_dict()[name], tensor), name
    finally:
        rollout.close()
