"""Routing replay (lightning_rl.core.routes, lightning_rl.core.logprobs): the in-process sampler's routes,
replayed in the trainer's forward, reproduce its log-probs in every forward layout; one changed route changes them;
the routers still get their gradient."""

from __future__ import annotations

import pytest
import torch

from components.rollout import HFRollout
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.logprobs import policy_outputs
from lightning_rl.core.moe import routers
from lightning_rl.core.routes import (
    RouteRecorder,
    replay_unsupported,
    replayed_gates,
    replaying,
    route_agreement,
    routes_agree,
    sampler_routes,
)
from tests.helpers import prompts
from tests.support.moe import FAMILIES, build_moe

LAYOUTS = {  # packed, prompts, group size: the forward layouts of lightning_rl.core.logprobs
    "one-call": (False, [0, 1, 2], 1),
    "packed-groups": (False, [0, 1, 2], 2),
    "kv-cache": (False, [0, 0, 1], 2),
    "padding-free": (True, [0, 1, 1], 2),
}


def _sampled(family: str = "qwen3_moe", rows=(0, 1, 2), group_size: int = 2, seed: int = 0):
    """A batch the in-process sampler drew from a random MoE (fp32), with its log-probs and routes."""
    model, tokenizer = build_moe(family, seed=seed)
    tokenizer.padding_side = "left"
    model.eval()
    rollout = HFRollout(group_size=group_size, max_new_tokens=6, temperature=1.0, return_logprobs=True)
    rollout.setup(tokenizer)
    texts = ["12+3=", "7+70=", "1+1="]
    enc = tokenizer([texts[i] for i in rows], return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    return model, rollout.generate(prompts(enc["input_ids"], enc["attention_mask"]), model)


def test_the_sampler_records_every_tokens_route():
    model, batch = _sampled(rows=(0, 2))
    b, r = batch.response_ids.shape
    p = batch.prompt_ids.shape[1]
    assert batch.routed_experts.shape == (b, r, 2, 2) and batch.prompt_routed_experts.shape == (b, p, 2, 2)
    # against a plain forward of each sample, unpadded: the experts each router chose at each position it was fed
    for i in range(b):
        prompt = batch.prompt_ids[i][batch.prompt_mask[i].bool()]
        n = int(batch.response_mask[i].sum())
        ids = torch.cat([prompt, batch.response_ids[i, :n]])[None]
        recorder = RouteRecorder(model)
        with torch.no_grad(), recorder.recording():
            model(input_ids=ids)
        own = recorder.take(1, ids.shape[1])[0].sort(-1).values  # (T, L, K)
        assert torch.equal(batch.prompt_routed_experts[i, p - len(prompt) :].sort(-1).values, own[: len(prompt)])
        assert torch.equal(batch.routed_experts[i, : n - 1].sort(-1).values, own[len(prompt) : len(prompt) + n - 1])
        assert (batch.routed_experts[i, n - 1 :] == -1).all()  # the last token is never fed; padding is no token
        assert (batch.prompt_routed_experts[i, : p - len(prompt)] == -1).all()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_replayed_routes_reproduce_the_samplers_logprobs(layout):
    packed, rows, g = LAYOUTS[layout]
    model, batch = _sampled(rows=rows, group_size=g)
    m = batch.response_mask.bool()
    with torch.no_grad():
        got = policy_outputs(model, batch, packed=packed, replay_routes=True).logprobs
    torch.testing.assert_close(got[m], batch.rollout_logprobs[m], atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_one_changed_route_changes_the_logprobs_after_it(layout):
    packed, rows, g = LAYOUTS[layout]
    model, batch = _sampled(rows=rows, group_size=g)
    routes = batch.routed_experts.clone()
    chosen = routes[0, 0, 0].tolist()  # response token 0 of row 0, first layer: fed to predict token 1
    routes[0, 0, 0, 0] = next(e for e in range(4) if e not in chosen)
    with torch.no_grad():
        base = policy_outputs(model, batch, packed=packed, replay_routes=True).logprobs
        moved = policy_outputs(model, batch.replace(routed_experts=routes), packed=packed, replay_routes=True).logprobs
    assert (moved[0, 1:] - base[0, 1:]).abs().max() > 1e-4  # the tokens after it see another expert's output
    torch.testing.assert_close(moved[0, :1], base[0, :1], atol=1e-6, rtol=0)  # token 0 was predicted before it
    torch.testing.assert_close(moved[1:], base[1:], atol=1e-6, rtol=0)  # other rows do not see it


@pytest.mark.parametrize("family", FAMILIES)
def test_replaying_the_models_own_routes_is_its_own_forward_and_gradient(family):
    """In fp32 the sampler's routes are the trainer's: the replayed forward and its gradient (the routers' included)
    equal the plain ones, so the replayed gates are the router's own, renormalised as its config says."""
    model, batch = _sampled(family, rows=(0, 0, 1))
    model.train()
    grads = []
    for replay in (False, True):
        model.zero_grad()
        out = policy_outputs(model, batch, replay_routes=replay)
        (out.logprobs * batch.response_mask).sum().backward()
        grads.append([r.module.weight.grad.clone() for r in routers(model)])
    for plain, replayed in zip(*grads):
        assert replayed.abs().sum() > 0  # the router learns under replay
        torch.testing.assert_close(replayed, plain, atol=1e-5, rtol=1e-4)


def test_the_router_learns_through_replayed_gates_other_than_its_own():
    """Replayed experts the router would not choose still pass the gradient to it through their gates."""
    model, batch = _sampled(rows=(0, 1))
    model.train()
    routes = batch.routed_experts.clone()
    routes[routes >= 0] = (routes[routes >= 0] + 1) % 4  # other experts everywhere
    out = policy_outputs(model, batch.replace(routed_experts=routes), replay_routes=True)
    (out.logprobs * batch.response_mask).sum().backward()
    assert all(r.module.weight.grad.abs().sum() > 0 for r in routers(model))


def test_replayed_gates_by_hand():
    # logits [ln 1, ln 2, ln 3, ln 4] (softmax [0.1, 0.2, 0.3, 0.4]), experts {0, 2}:
    #   renormalised (Qwen3-MoE norm_topk_prob, Mixtral): [0.1, 0.3] / 0.4 = [0.25, 0.75]; not: [0.1, 0.3]
    model, _ = build_moe("qwen3_moe")
    router = routers(model)[0].module
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]]).log()
    experts = torch.tensor([[0, 2]])
    router.norm_topk_prob = True
    torch.testing.assert_close(replayed_gates(router, logits, experts), torch.tensor([[0.25, 0.75]]))
    router.norm_topk_prob = False
    torch.testing.assert_close(replayed_gates(router, logits, experts), torch.tensor([[0.1, 0.3]]))


def test_unknown_routes_leave_the_router_its_own_choice():
    model, _ = build_moe("olmoe")
    ids = torch.randint(3, 18, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        free = model(input_ids=ids).logits
        with replaying(model, torch.full((2, 5, 2, 2), -1)):
            same = model(input_ids=ids).logits
    torch.testing.assert_close(same, free, atol=0, rtol=0)


def test_replay_on_a_dense_model_is_refused_in_one_line(tiny_model_path):
    from lightning_rl.core.models import ModelSpec, load_causal_lm

    said = replay_unsupported(load_causal_lm(ModelSpec(path=tiny_model_path)))
    assert said.startswith("model.routing_replay: LlamaForCausalLM has no router") and "\n" not in said
    assert replay_unsupported(build_moe("mixtral")[0]) is None


def test_route_agreement_by_hand():
    # one token, two layers, k = 2, E = 4. Layer 0 logits top-2 {3, 2}; sampler {2, 3}: 2 agree.
    # layer 1 logits top-2 {0, 1}; sampler {1, 3}: 1 agrees. A second token is masked out; a third has no route.
    logits = torch.tensor([[[0.0, 1.0, 2.0, 3.0], [3.0, 2.0, 1.0, 0.0]]]).repeat(3, 1, 1)  # (T, L, E)
    given = torch.tensor([[[2, 3], [1, 3]], [[3, 2], [0, 1]], [[-1, -1], [-1, -1]]])  # (T, L, K)
    hits, total = route_agreement(logits, given, torch.tensor([1.0, 0.0, 1.0]))
    assert (float(hits), float(total)) == (3.0, 4.0)
    # all routes of a token agree: the first does not (layer 1), the second does, the third's are unknown
    assert routes_agree(logits, given).tolist() == [False, True, False]


def test_sampler_routes_sit_where_router_logits_are_taken():
    prompt = torch.arange(2 * 3 * 1 * 1).reshape(2, 3, 1, 1)
    routes = 100 + torch.arange(2 * 4).reshape(2, 4, 1, 1)
    got = sampler_routes(prompt, routes)[..., 0, 0]
    assert got.tolist() == [[2, 100, 101, 102], [5, 104, 105, 106]]


def test_routes_survive_concatenation_padded_unknown():
    a = RolloutBatch(
        response_ids=torch.ones(1, 2, dtype=torch.long),
        response_mask=torch.ones(1, 2, dtype=torch.long),
        prompt_ids=torch.ones(1, 1, dtype=torch.long),
        prompt_mask=torch.ones(1, 1, dtype=torch.long),
        routed_experts=torch.zeros(1, 2, 2, 2, dtype=torch.long),
        prompt_routed_experts=torch.zeros(1, 1, 2, 2, dtype=torch.long),
    )
    b = a.replace(
        response_ids=torch.ones(1, 3, dtype=torch.long),
        response_mask=torch.ones(1, 3, dtype=torch.long),
        prompt_ids=torch.ones(1, 2, dtype=torch.long),
        prompt_mask=torch.ones(1, 2, dtype=torch.long),
        routed_experts=torch.ones(1, 3, 2, 2, dtype=torch.long),
        prompt_routed_experts=torch.ones(1, 2, 2, 2, dtype=torch.long),
    )
    both = RolloutBatch.cat([a, b])
    assert both.routed_experts.shape == (2, 3, 2, 2) and both.prompt_routed_experts.shape == (2, 2, 2, 2)
    assert (both.routed_experts[0, 2] == -1).all() and (both.prompt_routed_experts[0, 0] == -1).all()
    assert (both.prompt_routed_experts[0, 1] == 0).all() and (both.routed_experts[1] == 1).all()
