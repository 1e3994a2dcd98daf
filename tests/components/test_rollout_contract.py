"""The contract every server engine keeps, run against two: the loopback SGLang server and a real vLLM server (vLLM's
CPU build; tests/fixtures/vllm_server.py). Generation with the engine's own log-probs equal to the trainer's (fp32),
a verified weight push after every update, a stale tensor caught and named, LoRA adapters, a server killed and
restarted; on the tiny dense policy and on the shipped mixture of experts (its experts pushed as 3-D tensors' slices,
a stale layer of experts named). The fits (asynchronous, agents) are in
tests/lightning_rl/loop/test_rollout_contract_fits.py."""

from __future__ import annotations

import re

import pytest
import torch

from components.rollout.server.settings import Servers, Verification, WeightPush
from lightning_rl.core.lora import LoraSpec
from lightning_rl.core.models import ModelSpec, load_causal_lm
from tests.helpers import prompts as make_prompts
from tests.support.engines import MODEL, MOE, LoopbackSGLang, RealVLLM, gap, perturb

MODELS = {"dense": MODEL, "moe": MOE}


@pytest.fixture(scope="module")
def loopbacks():
    """The loopback server of each model, started when a test first asks for it."""
    from tests.fixtures.sglang_server import ServerProcess

    started = {}

    def of(model: str):
        if model not in started:
            started[model] = ServerProcess(model, env={"OMP_NUM_THREADS": "1"})
        return started[model]

    yield of
    for process in started.values():
        process.stop()


ENGINES = [
    pytest.param(
        (e, m),
        marks=[pytest.mark.slow, pytest.mark.xdist_group("vllm")],
        id=f"{e}-{m}",
    )
    for m in MODELS
    for e in ("sglang", "vllm")
]
"""Both engines on both models; one xdist worker runs these (the run has one vLLM server of each model)."""


@pytest.fixture(params=ENGINES)
def engine(request, loopbacks):
    kind, model = request.param
    if kind == "sglang":
        served = LoopbackSGLang(loopbacks(MODELS[model]), MODELS[model])
    else:
        served = RealVLLM(request.getfixturevalue("vllm_server" if model == "dense" else "vllm_moe_server"))
    yield served
    served.close()


@pytest.fixture
def policy(engine):
    return load_causal_lm(ModelSpec(path=engine.model))


@pytest.fixture
def prompts(engine):
    enc = engine.tokenizer(["12+3=", "4*5=", "71*23="], return_tensors="pt", padding=True)
    return make_prompts(enc.input_ids, enc.attention_mask)


def _step(policy, batch, lr: float) -> None:
    """One SGD step that makes the sampled tokens likelier: the served distribution must move with it."""
    from lightning_rl.core.logprobs import policy_logprobs

    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=lr)
    (-(policy_logprobs(policy.train(), batch, 1.0)[0] * batch.response_mask).sum()).backward()
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_samples_carry_the_engines_logprobs_equal_to_the_trainers(engine, policy, prompts, temperature):
    rollout = engine.make(group_size=4, max_new_tokens=8, temperature=temperature)
    batch = rollout.generate(prompts, policy)
    assert batch.batch_size == 12 and batch.group_ids.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert set(batch.versions.tolist()) == {1} and batch.response_mask.sum() > 12
    assert (batch.rollout_logprobs[batch.response_mask == 0] == 0).all()
    assert gap(policy, batch, temperature) <= 1e-4  # per token, fp32 on both sides
    if temperature != 1.0:
        assert gap(policy, batch, 1.0) > 1e-2  # the engine reports the tempered distribution it sampled from


@pytest.mark.slow
@pytest.mark.xdist_group("vllm")
@pytest.mark.parametrize("top_k, top_p", [(0, 0.9), (4, 1.0), (8, 0.8)])
def test_vllms_truncated_logprobs_equal_the_trainers_with_the_truncation_mirrored(vllm_server, top_k, top_p):
    """#46 item 7: vLLM's processed log-probs are renormalised over the tokens top-k / top-p kept; the trainer mirrors
    the truncation (`Truncation`), where it took the whole vocabulary before (a gap of log(kept mass) per token)."""
    from lightning_rl.core.truncation import Truncation
    from tests.support.engines import gaps

    engine = RealVLLM(vllm_server)
    try:
        policy = load_causal_lm(ModelSpec(path=engine.model))
        enc = engine.tokenizer(["12+3=", "4*5=", "71*23=", "9-4="], return_tensors="pt", padding=True)
        rollout = engine.make(group_size=8, max_new_tokens=12, temperature=1.0, top_k=top_k, top_p=top_p)
        rollout.sync_weights(policy)  # the launch weights: earlier tests pushed others
        batch = rollout.generate(make_prompts(enc.input_ids, enc.attention_mask), policy)
        before, after = gaps(policy, batch), gaps(policy, batch, truncation=Truncation.of(rollout.params))
        m = batch.response_mask.bool()
        print(f"top_k {top_k} top_p {top_p}: {int(m.sum())} tokens; |trainer - vLLM| untruncated mean "
              f"{before[m].mean():.3g} max {before[m].max():.3g}; truncated mean {after[m].mean():.3g} max {after[m].max():.3g}")  # fmt: skip
        assert float(after.max()) <= 1e-4
        assert float(before.max()) > 1e-2  # the sampler renormalised: the untruncated log-probs are off
    finally:
        engine.close()


@pytest.mark.parametrize("weight_sync", ["disk", "distributed"])
def test_every_update_is_pushed_verified_and_served(engine, policy, prompts, weight_sync):
    """Three iterations: sample, update (a random step: an SGD step on three prompts soon makes the tiny policy
    deterministic, where old and new weights give the same log-probs), push (checked: checksums and probe); the next
    samples are the new policy's."""
    import copy

    rollout = engine.make(
        group_size=4, max_new_tokens=8, weights=WeightPush(weight_sync=weight_sync), verify=Verification(tolerance=1e-3)
    )
    rollout.sync_weights(policy)
    for version in (2, 3, 4):
        before = copy.deepcopy(policy)
        perturb(policy, 0.05, seed=version)
        rollout.sync_weights(policy)
        assert rollout.weight_version == version
        batch = rollout.generate(prompts, policy)
        assert set(batch.versions.tolist()) == {version}
        assert gap(policy, batch) <= 1e-4 and gap(before, batch) > 1e-3  # served: the update, not the weights before


def test_a_stale_tensor_is_caught_and_named(engine, policy, prompts):
    """Dense: one norm tensor. Mixture of experts: every expert's down projection of layer 1, which the server holds
    as one fused tensor (SGLang's ``experts.w2_weight``, vLLM's ``experts.routed_experts.w2_weight``; vLLM's layer,
    pushed in part, keeps the weights it held, its gate and up projections too: the plugin's transfer engine)."""
    experts = getattr(policy.config, "num_experts", 0)
    if experts:
        stale = [f"model.layers.1.mlp.experts.{e}.down_proj.weight" for e in range(experts)]
        named = rf"{re.escape(stale[0])} and {experts - 1} more \(the server's model\.layers\.1\.mlp\.experts\.\S*w2_weight\)"
    else:
        stale = ["model.layers.1.post_attention_layernorm.weight"]
        named = re.escape(stale[0])
    rollout = engine.make(group_size=2, max_new_tokens=4, weights=WeightPush(weight_sync="distributed"))
    rollout.sync_weights(policy)
    perturb(policy, 0.02)
    with (
        engine.stale(stale),
        pytest.raises(
            engine.error, match=rf"{engine.url} does not hold the weights just pushed \(version 2\): .*{named}"
        ),
    ):
        rollout.sync_weights(policy)
    assert rollout.pusher.state.failed
    batch = rollout.generate(prompts, policy)  # pushed again, whole, before it samples
    assert set(batch.versions.tolist()) == {3} and gap(policy, batch) <= 1e-4


def test_a_lora_adapter_is_pushed_and_sampled(engine, prompts):
    if engine.name == "vllm" and engine.model == MOE:
        pytest.skip("vLLM 0.32's CPU build runs LoRA on fused experts with Triton kernels it lacks: no LoRA on an MoE")
    targets = ["q_proj", "v_proj", "down_proj" if engine.model == MODEL else "o_proj"]  # an MoE's: attention only
    lora = load_causal_lm(ModelSpec(path=engine.model, lora=LoraSpec(rank=4, alpha=8, target_modules=targets)))
    engine.make().sync_weights(
        load_causal_lm(ModelSpec(path=engine.model))
    )  # the base again: earlier tests pushed others
    rollout = engine.make(group_size=4, max_new_tokens=8)
    batch = rollout.generate(prompts, lora)  # adapter v1: B = 0, the base's distribution (the probe checks the base)
    _step(lora, batch, lr=20.0)
    rollout.sync_weights(lora)
    batch = rollout.generate(prompts, lora)
    assert re.fullmatch(r"policy-[0-9a-f]{8}-v2", rollout.pusher.adapters.current)
    assert set(batch.versions.tolist()) == {2}
    assert gap(lora, batch) <= 1e-4
    assert gap(load_causal_lm(ModelSpec(path=engine.model)), batch) > 1e-2  # the adapter moved the served distribution


def test_a_server_that_outlives_a_run_takes_the_next_runs_adapters_and_close_unloads_them(engine, prompts):
    """Both engines refuse to load a name they hold: a run ended without closing (or resumed from a checkpoint) left
    its adapters loaded, and the next run's version 1 must not be refused for it."""
    if engine.name == "vllm" and engine.model == MOE:
        pytest.skip("vLLM 0.32's CPU build runs LoRA on fused experts with Triton kernels it lacks: no LoRA on an MoE")
    lora = load_causal_lm(ModelSpec(path=engine.model, lora=LoraSpec(rank=4, alpha=8, target_modules=["q_proj"])))
    first = engine.make(group_size=2, max_new_tokens=4)
    first.generate(prompts, lora)  # the first run's v1, left loaded: this run does not close before the next starts
    second = engine.make(group_size=2, max_new_tokens=4)
    batch = second.generate(prompts, lora)
    names = first.pusher.adapters.current, second.pusher.adapters.current
    assert names[0] != names[1] and all(n.endswith("-v1") for n in names) and set(batch.versions.tolist()) == {1}
    assert gap(lora, batch) <= 1e-4
    second.close()
    again = engine.make(group_size=2, max_new_tokens=4)
    again.pusher.adapters.run = second.pusher.adapters.run  # the name the second run loaded and unloaded at close
    again.generate(prompts, lora)
    assert again.pusher.adapters.current == names[1]


# the real vLLM's restart on the MoE repeats the dense one's at length (30 s): `make test-all`
KILLED = [
    pytest.param(*p.values, marks=[*p.marks, pytest.mark.soak], id=p.id) if p.id == "vllm-moe" else p for p in ENGINES
]


@pytest.mark.parametrize("engine", KILLED, indirect=True)
def test_a_killed_server_is_named_and_a_restarted_one_gets_the_whole_policy(engine, policy, prompts):
    rollout = engine.make(
        group_size=2,
        max_new_tokens=4,
        servers=Servers(max_retries=1, server_wait_s=0),
        weights=WeightPush(weight_sync="distributed"),
    )
    rollout.sync_weights(policy)
    engine.kill()
    with pytest.raises(engine.error, match=engine.url):
        rollout.generate(prompts, policy)
    engine.restart()  # the same address, its launch weights, in no weight-transfer group
    perturb(policy, 0.05)
    rollout.sync_weights(policy)  # a new group; verified
    batch = rollout.generate(prompts, policy)
    assert gap(policy, batch) <= 1e-4 and set(batch.versions.tolist()) == {rollout.weight_version}


@pytest.mark.parametrize("weight_sync", ["disk", "distributed"])
def test_a_server_that_serves_another_model_is_refused_before_anything_is_sent(engine, weight_sync):
    """The servers serve tiny-calc (22 tokens) or the tiny MoE; a tiny-arith policy (18) is refused in one line at its
    first push, before anything is sent (before, nothing was checked: the push failed with an HTTP 500 and 'check
    base_url'). The MoE server differs from it by its architecture (SGLang reports it) or its weights (vLLM does not)."""
    from lightning_rl.core.models import TINY_MODEL_PATH

    other = load_causal_lm(ModelSpec(path=TINY_MODEL_PATH))
    rollout = engine.make(group_size=2, max_new_tokens=4, weights=WeightPush(weight_sync=weight_sync))
    with pytest.raises(engine.error) as err:
        rollout.sync_weights(other)
    message = str(err.value)
    assert message.startswith(f"{engine.error.engine} server at {engine.url} serves {engine.model}, not the policy's: ")
    named = "the policy's" if engine.model == MOE else "its vocabulary has 22 tokens, the policy's 18"
    assert named in message and "\n" not in message
    assert rollout.weight_version == 0 and rollout.pusher.state.view().needs_sync  # nothing pushed


def test_the_widened_policy_vllm_serves_computes_the_same_function(tmp_path):
    """vLLM's CPU attention has no kernel for head_dim 16: its server gets tiny-calc with 32-dimension heads."""
    from tests.fixtures.vllm_server import TINY_CALC, widen_heads

    wide = load_causal_lm(ModelSpec(path=str(widen_heads(TINY_CALC, tmp_path / "wide")))).eval()
    shipped = load_causal_lm(ModelSpec(path=str(TINY_CALC))).eval()
    ids = torch.randint(0, shipped.config.vocab_size, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(wide(input_ids=ids).logits, shipped(input_ids=ids).logits, atol=1e-4, rtol=0)
    assert wide.config.head_dim == 32 and shipped.config.head_dim == 16
