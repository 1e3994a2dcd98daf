"""LoadBalancingLoss (Switch Transformer's auxiliary loss with top-k routing): hand-computed values, transformers'
implementation and a float64 loop as independent re-derivations, its gradient, the packed layout, every option."""

from __future__ import annotations

import math

import pytest
import torch

from components.aggregator import TokenMean
from components.load_balance import LoadBalancingLoss
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.forward_outputs import PolicyForward, RouterLogits


def _forward(logits: torch.Tensor, top_k: int) -> PolicyForward:
    return PolicyForward(None, router_logits=RouterLogits(logits, top_k))


def _batch(mask: torch.Tensor) -> RolloutBatch:
    return RolloutBatch(response_ids=torch.zeros(mask.shape, dtype=torch.long), response_mask=mask)


def test_hand_computed_values():
    # one layer, E = 2, k = 1; one row of four tokens, the last not counted:
    #   logits      top-1  softmax
    #   [ln 3, 0]     0    [3/4, 1/4]
    #   [0, ln 3]     1    [1/4, 3/4]
    #   [ln 3, 0]     0    [3/4, 1/4]
    # f = [2/3, 1/3]; per token 2 (f . p): [2 (1/2 + 1/12), 2 (1/6 + 1/4), 2 (1/2 + 1/12)] = [7/6, 5/6, 7/6]
    # their mean = E sum_i f_i P_i = 2 (2/3 * 7/12 + 1/3 * 5/12) = 19/18; times coef 0.01
    ln3 = math.log(3.0)
    logits = torch.tensor([[[ln3, 0.0], [0.0, ln3], [ln3, 0.0], [0.0, 5.0]]])[:, :, None, :]  # (B=1, R=4, L=1, E=2)
    batch = _batch(torch.tensor([[1, 1, 1, 0]]))
    term = LoadBalancingLoss(coef=0.01)(_forward(logits, 1), batch)
    torch.testing.assert_close(term[0, :3], 0.01 * torch.tensor([7 / 6, 5 / 6, 7 / 6]), atol=1e-6, rtol=0)
    assert float(TokenMean()(term, batch.loss_mask)) == pytest.approx(0.01 * 19 / 18, abs=1e-7)


def test_balanced_routing_costs_coef_and_the_top_k_count_is_normalised():
    # E = 4, k = 2: four tokens whose top 2 cover every expert twice and whose mean probabilities are uniform
    logits = torch.tensor([[[2.0, 2.0, 0.0, 0.0], [0.0, 0.0, 2.0, 2.0], [2.0, 0.0, 2.0, 0.0], [0.0, 2.0, 0.0, 2.0]]])
    term = LoadBalancingLoss(coef=1.0)(_forward(logits[:, :, None, :], 2), _batch(torch.ones(1, 4)))
    assert float(term.mean()) == pytest.approx(1.0, abs=1e-6)


def test_one_layer_is_transformers_loss_over_k():
    """transformers' ``load_balancing_loss_func`` (Qwen3-MoE's) leaves f summing to k: k times this loss on one layer."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 1, 8, generator=g)  # (B, R, L=1, E)
    term = LoadBalancingLoss(coef=1.0)(_forward(logits, 2), _batch(torch.ones(3, 7)))
    theirs = load_balancing_loss_func((logits.reshape(21, 8),), num_experts=8, top_k=2)
    assert float(term.mean()) * 2 == pytest.approx(float(theirs), rel=1e-5)


def test_several_layers_and_a_mask_against_a_float64_loop():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 6, 3, 5, generator=g)  # (B, R, L, E)
    mask = (torch.rand(4, 6, generator=g) > 0.4).long()
    term = LoadBalancingLoss(coef=0.1)(_forward(logits, 2), _batch(mask))
    counted = [(b, t) for b in range(4) for t in range(6) if mask[b, t]]
    total = 0.0
    for layer in range(3):
        f = torch.zeros(5, dtype=torch.float64)
        p = torch.zeros(5, dtype=torch.float64)
        for b, t in counted:
            z = logits[b, t, layer].double()
            f[z.topk(2).indices] += 1.0 / (2 * len(counted))
            p += torch.softmax(z, -1) / len(counted)
        total += 5 * float((f * p).sum()) / 3
    assert float(TokenMean()(term, mask)) == pytest.approx(0.1 * total, rel=1e-6)
    assert float(term[mask == 0].abs().sum()) > 0  # padding carries values; the aggregator's mask drops them


def test_the_gradient_moves_probability_off_the_overloaded_expert():
    # f = [1, 0] (every token picks expert 0 with k = 1): dL/dz_t = 2 (p0 p1, -p0 p1) / T, toward expert 1
    logits = torch.tensor([[[1.0, 0.0], [2.0, 0.0]]])[:, :, None, :].requires_grad_(True)  # (1, 2, 1, 2)
    term = LoadBalancingLoss(coef=1.0)(_forward(logits, 1), _batch(torch.ones(1, 2)))
    TokenMean()(term, torch.ones(1, 2)).backward()
    p = torch.softmax(logits.detach(), -1)
    expected = 2 * torch.stack([p[..., 0] * p[..., 1], -p[..., 0] * p[..., 1]], -1) / 2
    torch.testing.assert_close(logits.grad, expected, atol=1e-6, rtol=0)


def test_a_packed_layout_gives_the_padded_terms():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, 2, 4, generator=g)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    token_mask = mask.bool()

    def scatter(values):
        return values.new_zeros(token_mask.shape).index_put((token_mask,), values)

    padded = LoadBalancingLoss()(_forward(logits, 2), _batch(mask))
    packed = PolicyForward(None, router_logits=RouterLogits(logits[token_mask], 2, token_mask, scatter))
    torch.testing.assert_close(LoadBalancingLoss()(packed, _batch(mask)), padded * mask, atol=1e-7, rtol=0)


def test_every_option_changes_the_output_and_bad_ones_are_refused():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 5, 2, 6, generator=g)
    batch = _batch(torch.ones(2, 5))
    base = LoadBalancingLoss()(_forward(logits, 2), batch)
    assert not torch.allclose(LoadBalancingLoss(coef=0.01)(_forward(logits, 2), batch), base)
    assert not torch.allclose(LoadBalancingLoss(top_k=1)(_forward(logits, 2), batch), base)
    assert LoadBalancingLoss.reads == {"router_logits"}
    with pytest.raises(ValueError, match="coef must be >= 0"):
        LoadBalancingLoss(coef=-1.0)
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        LoadBalancingLoss(top_k=0)
    with pytest.raises(ValueError, match="reads the router logits of a mixture-of-experts policy"):
        LoadBalancingLoss()(PolicyForward(torch.zeros(2, 5)), batch)
