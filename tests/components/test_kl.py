import math

import pytest
import torch

from components.kl import KLRegularizer, kl_estimate
from lightning_rl.core.batch import RolloutBatch


def test_seed_numbers_for_one_token():
    # seeds, ch. 6.9 exercise 3: log pi = -3, log pi_ref = -2
    logp, ref = torch.tensor([-3.0]), torch.tensor([-2.0])
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(-1.0)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.7183, abs=1e-4)


def test_estimators_match_independent_formulas_on_random_tensors():
    torch.manual_seed(0)
    logp, ref = -torch.rand(5, 7) * 4, -torch.rand(5, 7) * 4
    rho = torch.exp(ref - logp)
    torch.testing.assert_close(kl_estimate(logp, ref, "k1"), -torch.log(rho))
    torch.testing.assert_close(kl_estimate(logp, ref, "k2"), 0.5 * torch.log(rho) ** 2)
    torch.testing.assert_close(kl_estimate(logp, ref, "k3"), rho - 1 - torch.log(rho))
    assert (kl_estimate(logp, ref, "k3") >= 0).all() and (kl_estimate(logp, ref, "k1") < 0).any()


def test_only_k3s_exponential_is_capped_and_the_clamp_is_counted():
    """#46 item 2: log rho was clamped to +-20 for every estimator, zeroing k1's and k2's gradients (and k3's below
    -20). Now k3 alone caps log rho at +20 (value expm1(20) - 20, gradient 0): log pi = [-30, -1, -1, -1],
    log ref = [-1, -30, -26, -1] -> log rho = [29, -29, -25, 0]."""
    logp = torch.tensor([[-30.0, -1.0, -1.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -30.0, -26.0, -1.0]])
    k2 = kl_estimate(logp, ref, "k2")
    torch.testing.assert_close(k2, torch.tensor([[420.5, 420.5, 312.5, 0.0]]))
    (grad,) = torch.autograd.grad(k2.sum(), logp)
    torch.testing.assert_close(grad, torch.tensor([[-29.0, 29.0, 25.0, 0.0]]))  # d k2 / d log pi = -log rho
    (grad,) = torch.autograd.grad(kl_estimate(logp, ref, "k1").sum(), logp)
    torch.testing.assert_close(grad, torch.ones(1, 4))
    k3 = kl_estimate(logp, ref, "k3")
    expected = [math.expm1(20.0) - 20.0, math.exp(-29.0) - 1 + 29, math.exp(-25.0) - 1 + 25, 0.0]
    torch.testing.assert_close(k3, torch.tensor([expected]), rtol=1e-6, atol=0)
    (grad,) = torch.autograd.grad(k3.sum(), logp)  # d k3 / d log pi = 1 - rho: 0 where capped, ~1 where rho ~ 0
    torch.testing.assert_close(grad, torch.tensor([[0.0, 1.0, 1.0, 0.0]]), rtol=0, atol=1e-6)
    batch = RolloutBatch(
        response_ids=torch.zeros(1, 4, dtype=torch.long), response_mask=torch.ones(1, 4), ref_logprobs=ref,
        old_logprobs=torch.tensor([[-30.0, -1.0, -22.0, -1.0]]),
    )  # fmt: skip
    assert KLRegularizer(coef=0.1, estimator="k3").clamped(logp, batch).tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert KLRegularizer(coef=0.1, estimator="k2").clamped(logp, batch).tolist() == [[0.0, 0.0, 0.0, 0.0]]
    weighted = KLRegularizer(coef=0.1, estimator="k2", importance_weighted=True)  # log pi / pi_old = [0, 0, 21, 0]
    assert weighted.clamped(logp, batch).tolist() == [[0.0, 0.0, 1.0, 0.0]]
    assert KLRegularizer(coef=0.0, estimator="k3").clamped(logp, batch).tolist() == [[0.0] * 4]


def test_k3_unbiased_on_a_categorical():
    torch.manual_seed(0)
    q = torch.randn(50).softmax(-1)
    p = (q.log() + 0.3 * torch.randn(50)).softmax(-1)
    exact = (q * (q / p).log()).sum()
    x = torch.multinomial(q, 200_000, replacement=True)
    for est in ("k1", "k3"):
        assert kl_estimate(q.log()[x], p.log()[x], est).mean().item() == pytest.approx(exact.item(), rel=0.05)


def _exact_grads(logits_pi, logits_ref):
    """Exact gradients wrt the policy logits of KL(pi||ref) and KL(ref||pi)."""
    z = logits_pi.clone().requires_grad_(True)
    pi, ref = z.softmax(-1), logits_ref.softmax(-1)
    reverse = torch.autograd.grad((pi * (pi.log() - ref.log())).sum(), z)[0]
    z2 = logits_pi.clone().requires_grad_(True)
    forward = torch.autograd.grad((ref * (ref.log() - z2.log_softmax(-1))).sum(), z2)[0]
    return reverse, forward


def _expected_loss_grad(logits_pi, logits_ref, estimator, weighted=False):
    """E_{y~pi}[grad k(y)] computed exactly by enumerating the vocabulary (the on-policy gradient of the loss term)."""
    z = logits_pi.clone().requires_grad_(True)
    logp = z.log_softmax(-1)
    ref = logits_ref.log_softmax(-1)
    pi = logp.detach().exp()
    k = kl_estimate(logp, ref, estimator)
    if weighted:  # w = pi / pi_old with pi_old = sg(pi): value 1, gradient of the score
        k = k * torch.exp(logp - logp.detach())
    return torch.autograd.grad((pi * k).sum(), z)[0]


def test_k3_in_the_loss_follows_the_forward_kl_gradient_and_k2_the_reverse():
    torch.manual_seed(0)
    logits_pi, logits_ref = torch.randn(12), torch.randn(12)
    reverse, forward = _exact_grads(logits_pi, logits_ref)
    torch.testing.assert_close(_expected_loss_grad(logits_pi, logits_ref, "k3"), forward, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(_expected_loss_grad(logits_pi, logits_ref, "k2"), reverse, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(_expected_loss_grad(logits_pi, logits_ref, "k1"), torch.zeros(12), atol=1e-6, rtol=0)
    # DeepSeek-V3.2's importance weight turns k3's gradient into the reverse-KL one
    torch.testing.assert_close(
        _expected_loss_grad(logits_pi, logits_ref, "k3", weighted=True), reverse, atol=1e-5, rtol=1e-4
    )


def _batch(old, ref, mask):
    return RolloutBatch(response_ids=torch.zeros_like(mask), response_mask=mask, old_logprobs=old, ref_logprobs=ref)


def test_reward_placement_penalises_per_token_without_gradient():
    old = torch.tensor([[-3.0, -1.0, -1.0]])
    ref = torch.tensor([[-2.0, -1.5, -9.0]])
    mask = torch.tensor([[1, 1, 0]])
    kl = KLRegularizer(coef=0.1, estimator="k1", placement="reward")
    penalty = kl.reward_penalty(_batch(old, ref, mask))
    torch.testing.assert_close(penalty, torch.tensor([[0.1, -0.05, 0.0]]))
    assert kl.loss_term(old.clone().requires_grad_(), _batch(old, ref, mask)).abs().sum() == 0


def test_loss_placement_is_differentiable_and_zero_coef_needs_no_reference():
    kl = KLRegularizer(coef=0.04, estimator="k3", placement="loss")
    assert kl.requires == {"ref_logprobs"}
    assert KLRegularizer(coef=0.0).requires == frozenset()
    logp = torch.tensor([[-3.0]], requires_grad=True)
    term = kl.loss_term(logp, _batch(logp.detach(), torch.tensor([[-2.0]]), torch.ones(1, 1, dtype=torch.long)))
    term.sum().backward()
    # d/dlogp of beta * (e^(ref - logp) - 1 - (ref - logp)) = beta * (1 - e^(ref - logp))
    assert logp.grad.item() == pytest.approx(0.04 * (1 - torch.e), rel=1e-5)


def test_adaptive_controller_seed_numbers_and_clipping():
    kl = KLRegularizer(coef=0.2, target=6.0, horizon=10000)
    kl.update(8.0, n=256)  # error = clip(8/6 - 1, -0.2, 0.2) = 0.2 -> 0.2 * (1 + 0.2 * 256 / 10000)
    assert kl.coef.item() == pytest.approx(0.201024, abs=1e-7)
    kl.update(6.0 * 0.5, n=10000)  # error clipped at -0.2 -> * 0.8
    assert kl.coef.item() == pytest.approx(0.201024 * 0.8, abs=1e-7)
    fixed = KLRegularizer(coef=0.2)
    fixed.update(100.0, n=1000)
    assert fixed.coef.item() == pytest.approx(0.2)


def test_coefficient_is_saved_in_state_dict():
    kl = KLRegularizer(coef=0.2, target=6.0)
    kl.update(8.0, 256)
    other = KLRegularizer(coef=0.2, target=6.0)
    other.load_state_dict(kl.state_dict())
    assert other.coef.item() == kl.coef.item()


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError):
        KLRegularizer(estimator="k4")
    with pytest.raises(ValueError):
        KLRegularizer(placement="reward", importance_weighted=True)
