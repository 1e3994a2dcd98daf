"""Mixture-of-experts policies (lightning_rl.core.moe): the routers of every family transformers ships found in one
place, hooks on them, the router logits at the response positions in every forward layout, the routing statistics."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.logprobs import policy_outputs
from lightning_rl.core.moe import (
    RouterRecorder,
    expert_counts,
    experts_per_token,
    is_moe,
    load_cv,
    router_entropy,
    router_hooks,
    routers,
)
from tests.support.moe import FAMILIES, build_moe


@pytest.mark.parametrize("family", FAMILIES)
def test_every_router_is_found_in_module_order(family):
    model, _ = build_moe(family, layers=3)
    found = routers(model)
    prefix = "model.layers"
    assert [r.name.rsplit(".", 1)[0] for r in found] == [f"{prefix}.{i}.mlp" for i in range(3)]
    assert [r.layer for r in found] == [0, 1, 2] and all(r.logits_index == 0 for r in found)
    assert is_moe(model) and experts_per_token(model) == 2


def test_a_dense_model_has_no_router(tiny_model_path):
    from lightning_rl.core.models import ModelSpec, load_causal_lm

    model = load_causal_lm(ModelSpec(path=tiny_model_path))
    assert routers(model) == [] and not is_moe(model)
    with pytest.raises(ValueError, match="LlamaForCausalLM has no router to record"):
        with RouterRecorder(model).recording():
            pass


def test_the_transformers_declaration_routers_are_found_by():
    """`routers` reads transformers' ``_can_record_outputs["router_logits"]`` (an ``OutputRecorder``: ``target_class``,
    ``index``, ``layer_name``, ``class_name``), read from transformers 5.25. A release that moves it fails here: find
    where the model classes now declare the module whose output is the router logits, and read that in
    lightning_rl.core.moe._declarations."""
    import transformers
    from transformers.models.qwen3_moe import modeling_qwen3_moe as qwen3_moe

    recorder = qwen3_moe.Qwen3MoePreTrainedModel._can_record_outputs["router_logits"]
    assert recorder.target_class is qwen3_moe.Qwen3MoeTopKRouter and recorder.index == 0, transformers.__version__
    assert {"layer_name", "class_name"} <= set(vars(recorder))


def test_a_hook_may_replace_a_routers_output():
    """The seam routing replay uses: a hook returning another (logits, scores, indices) changes the forward."""
    model, _ = build_moe("qwen3_moe")
    ids = torch.randint(3, 18, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        free = model(input_ids=ids).logits
        seen = []

        def expert_zero(router, output):
            logits, scores, indices = output
            seen.append(router.layer)
            return (
                logits,
                torch.ones_like(scores) / scores.shape[-1],
                torch.zeros_like(indices),
            )  # every token: expert 0

        with router_hooks(model, expert_zero):
            forced = model(input_ids=ids).logits
        assert seen == [0, 1] and (forced - free).abs().max() > 1e-3
        torch.testing.assert_close(model(input_ids=ids).logits, free)  # the hooks are gone after the block


def test_statistics_by_hand():
    # one layer, 3 experts, k = 1, four tokens, the last not counted:
    #   logits      top-1   softmax
    #   [ln 4, 0, 0]   0    [2/3, 1/6, 1/6]
    #   [0, ln 4, 0]   1    [1/6, 2/3, 1/6]
    #   [ln 4, 0, 0]   0    [2/3, 1/6, 1/6]
    #   [0, 0, ln 4]   2    (masked out)
    # counts [2, 1, 0]: mean 1, population std sqrt((1 + 0 + 1) / 3), CV sqrt(2/3) = 0.81650
    # entropy of [2/3, 1/6, 1/6] = -(2/3 ln 2/3 + 2 * 1/6 ln 1/6) = 0.86756, three tokens: sum 2.60269
    ln4 = math.log(4.0)
    logits = torch.tensor([[ln4, 0, 0], [0, ln4, 0], [ln4, 0, 0], [0, 0, ln4]])[:, None, :]  # (T, L=1, E=3)
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    counts = expert_counts(logits, mask, k=1)
    assert counts.tolist() == [[2.0, 1.0, 0.0]]
    assert float(load_cv(counts)) == pytest.approx(math.sqrt(2 / 3), abs=1e-6)
    assert float(router_entropy(logits, mask)) == pytest.approx(3 * 0.8675632, abs=1e-5)
    assert float(load_cv(torch.tensor([[5.0, 5.0, 5.0], [0.0, 0.0, 0.0]]))) == 0.0  # balanced; a layer with no token


def test_statistics_against_a_loop_in_float64():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 2, 6, generator=g)  # (B, R, L, E)
    mask = (torch.rand(3, 5, generator=g) > 0.3).float()
    counts = torch.zeros(2, 6, dtype=torch.float64)
    entropy = 0.0
    for b in range(3):
        for t in range(5):
            if mask[b, t]:
                for layer in range(2):
                    z = logits[b, t, layer].double()
                    for i in z.topk(2).indices.tolist():
                        counts[layer, i] += 1
                    p = torch.softmax(z, -1)
                    entropy += float(-(p * p.log()).sum()) / 2
    torch.testing.assert_close(expert_counts(logits, mask, 2).double(), counts)
    cv = torch.stack([c.std(correction=0) / c.mean() for c in counts]).mean()
    assert float(load_cv(expert_counts(logits, mask, 2))) == pytest.approx(float(cv), rel=1e-6)
    assert float(router_entropy(logits, mask)) == pytest.approx(entropy, rel=1e-5)


def _reference(model, batch: RolloutBatch) -> torch.Tensor:
    """Router logits at the positions predicting each response token, one unpadded row at a time. Shape: (B, R, L, E)."""
    b, r = batch.response_ids.shape
    out = torch.zeros(b, r, len(routers(model)), model.config.num_experts)
    for i in range(b):
        prompt = batch.prompt_ids[i][batch.prompt_mask[i].bool()]
        length = int(batch.response_mask[i].sum())
        ids = torch.cat([prompt, batch.response_ids[i, :length]])[None]
        recorder = RouterRecorder(model)
        with recorder.recording():
            model(input_ids=ids)
        logits = recorder.take(1, ids.shape[1])[0]  # (T, L, E)
        out[i, :length] = logits[len(prompt) - 1 : len(prompt) - 1 + length]
    return out


def _batch(rows: list[int]) -> RolloutBatch:
    """Four samples of the prompts ``rows`` picks (two of them left-padded), responses of 4, 2, 3 and 1 tokens."""
    g = torch.Generator().manual_seed(1)
    prompt_mask = torch.ones(4, 5, dtype=torch.long)
    prompt_mask[1, :1] = prompt_mask[3, :2] = 0
    prompt_ids = torch.randint(3, 18, (4, 5), generator=g) * prompt_mask
    response_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]])
    response_ids = torch.randint(3, 18, (4, 4), generator=g) * response_mask
    return RolloutBatch(
        prompt_ids=prompt_ids[rows],
        prompt_mask=prompt_mask[rows],
        response_ids=response_ids,
        response_mask=response_mask,
    )


@pytest.mark.parametrize(
    "rows, packed",
    [([0, 1, 2, 3], False), ([0, 0, 1, 1], False), ([0, 0, 0, 1], False), ([0, 0, 1, 1], True)],
    ids=["one-call", "packed-groups", "kv-cache", "padding-free"],
)
def test_router_logits_sit_at_the_positions_predicting_the_response(rows, packed):
    model, _ = build_moe("qwen3_moe")
    model.eval()
    batch = _batch(rows)
    with torch.no_grad():
        forward = policy_outputs(model, batch, packed=packed, keep_router_logits=True)
        expected = _reference(model, batch)
    router = forward.router_logits
    assert router.top_k == 2 and (router.token_mask is not None) == packed
    mask = batch.response_mask.bool()
    got = router.logits if router.token_mask is None else torch.zeros_like(expected).index_put((mask,), router.logits)
    torch.testing.assert_close(got[mask], expected[mask], atol=1e-5, rtol=0)


def test_router_logits_carry_the_gradient_to_the_routers():
    model, _ = build_moe("qwen3_moe")
    batch = _batch([0, 0, 1, 1])
    forward = policy_outputs(model, batch, keep_router_logits=True)
    (forward.router_logits.logits * batch.response_mask[..., None, None]).sum().backward()
    grads = [r.module.weight.grad for r in routers(model)]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)
