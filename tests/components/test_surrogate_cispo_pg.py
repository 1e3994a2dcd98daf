import math

import pytest
import torch

from components.surrogate import CISPO, ClippedSurrogate, PolicyGradient
from lightning_rl.core.batch import RolloutBatch


def _batch(advantages, old, mask=None):
    advantages = torch.as_tensor(advantages, dtype=torch.float32)
    mask = torch.ones_like(advantages, dtype=torch.long) if mask is None else mask
    return RolloutBatch(
        response_ids=torch.zeros_like(mask),
        response_mask=mask,
        advantages=advantages,
        old_logprobs=torch.as_tensor(old),
    )


def _grad(surrogate, ratio, advantage, old=-1.0):
    """Gradient of the per-token loss w.r.t. log pi for one token with the given ratio and advantage."""
    old_t = torch.tensor([[old]])
    logp = (old_t + math.log(ratio)).requires_grad_(True)
    loss, metrics = surrogate(logp, _batch([[advantage]], old_t))
    loss.sum().backward()
    return logp.grad.item(), loss.item(), metrics


def test_cispo_keeps_the_gradient_of_clipped_tokens_that_ppo_zeroes():
    # A = +2, ratio 1.5 past 1 + eps_high = 1.28: PPO's gradient is 0; CISPO's is -sg(1.28) * 2 = -2.56
    ppo_grad, _, _ = _grad(ClippedSurrogate(eps_low=0.2, eps_high=0.28), 1.5, 2.0)
    assert ppo_grad == 0.0
    grad, loss, metrics = _grad(CISPO(eps_high=0.28), 1.5, 2.0)
    assert grad == pytest.approx(-2.56, abs=1e-6)
    # the loss value is -w A log pi with log pi = -1 + log 1.5
    assert loss == pytest.approx(-1.28 * 2.0 * (-1.0 + math.log(1.5)), abs=1e-6)
    assert metrics["policy/clipfrac_high"].item() == 1.0 and metrics["policy/clipfrac_low"].item() == 0.0
    # A = -1, ratio 0.5 below 1 - eps_low = 0.8: PPO zeroes it; CISPO pushes it down with weight 0.8
    assert _grad(ClippedSurrogate(eps_low=0.2, eps_high=0.28), 0.5, -1.0)[0] == 0.0
    grad_low, _, metrics_low = _grad(CISPO(eps_low=0.2, eps_high=0.28), 0.5, -1.0)
    assert grad_low == pytest.approx(0.8, abs=1e-6)
    assert metrics_low["policy/clipfrac_low"].item() == 1.0
    # the paper's setting has no lower bound: the weight is the ratio itself
    assert _grad(CISPO(eps_high=0.28), 0.5, -1.0)[0] == pytest.approx(0.5, abs=1e-6)


def test_inside_the_range_cispo_and_ppo_have_the_same_gradient():
    # d/dlogp of r A is r A, and CISPO's is sg(r) A: identical where the clip does not bind
    torch.manual_seed(0)
    old = -torch.rand(3, 5) * 2
    new = old + (torch.rand(3, 5) - 0.5) * 0.3  # |log r| < 0.15: r in (0.86, 1.16)
    adv = torch.randn(3, 5)
    grads = []
    for surrogate in (ClippedSurrogate(eps_low=0.2, eps_high=0.28), CISPO(eps_low=0.2, eps_high=0.28)):
        logp = new.clone().requires_grad_(True)
        surrogate(logp, _batch(adv, old))[0].sum().backward()
        grads.append(logp.grad)
    torch.testing.assert_close(grads[0], grads[1])
    torch.testing.assert_close(grads[1], -torch.exp(new - old) * adv)


def test_cispo_random_tensors_match_an_independent_formula():
    torch.manual_seed(1)
    old, new, adv = -torch.rand(4, 6) * 3, -torch.rand(4, 6) * 3, torch.randn(4, 6)
    logp = new.clone().requires_grad_(True)
    loss, _ = CISPO(eps_low=0.2, eps_high=0.28)(logp, _batch(adv, old))
    weight = torch.exp(new - old).clamp(0.8, 1.28)
    torch.testing.assert_close(loss, -weight * adv * new)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, -weight * adv)


def test_cispo_every_option_changes_the_output():
    torch.manual_seed(2)
    old, new, adv = -torch.rand(4, 6) * 3, -torch.rand(4, 6) * 3, torch.randn(4, 6)
    outs = [s(new, _batch(adv, old))[0] for s in (CISPO(), CISPO(eps_low=0.2), CISPO(eps_high=0.5))]
    for i in range(len(outs)):
        for j in range(i + 1, len(outs)):
            assert not torch.allclose(outs[i], outs[j]), (i, j)


def test_cispo_rejects_bad_ranges_and_clamps_extreme_ratios():
    with pytest.raises(ValueError, match="eps_high"):
        CISPO(eps_high=0.0)
    with pytest.raises(ValueError, match="eps_low"):
        CISPO(eps_low=1.5)
    loss, _ = CISPO()(torch.tensor([[-1.0]]), _batch([[1.0]], torch.tensor([[-200.0]])))
    assert torch.isfinite(loss).all()


def test_policy_gradient_is_minus_advantage_times_log_prob():
    torch.manual_seed(3)
    old, new, adv = -torch.rand(2, 4), -torch.rand(2, 4), torch.randn(2, 4)
    logp = new.clone().requires_grad_(True)
    loss, metrics = PolicyGradient()(logp, _batch(adv, old))
    torch.testing.assert_close(loss, -adv * new)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, -adv)  # no ratio: pi_old does not enter the gradient
    torch.testing.assert_close(metrics["policy/ratio_mean"], torch.exp(new - old).mean())


def test_policy_gradient_needs_no_old_logprobs():
    assert PolicyGradient.requires == frozenset({"advantages"})
    batch = RolloutBatch(
        response_ids=torch.zeros(1, 2, dtype=torch.long),
        response_mask=torch.ones(1, 2, dtype=torch.long),
        advantages=torch.ones(1, 2),
    )
    loss, metrics = PolicyGradient()(torch.tensor([[-1.0, -2.0]]), batch)
    torch.testing.assert_close(loss, torch.tensor([[1.0, 2.0]]))
    assert metrics == {}
