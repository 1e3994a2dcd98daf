import pytest
import torch

from components.surrogate import ClippedSurrogate
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


def _loss(surrogate, ratio, advantage):
    old = torch.tensor([[-1.0]])
    logp = (old + torch.log(torch.tensor([[ratio]]))).requires_grad_(True)
    loss, metrics = surrogate(logp, _batch([[advantage]], old))
    return loss, logp, metrics


def test_clip_higher_seed_number():
    # seeds, ch. 6.9 exercise 6 (i): A = +2, ratio 1.5, eps 0.2 / 0.28 -> surrogate min(3.0, 1.28 * 2) = 2.56
    loss, logp, metrics = _loss(ClippedSurrogate(eps_low=0.2, eps_high=0.28), 1.5, 2.0)
    assert -loss.item() == pytest.approx(2.56, abs=1e-5)
    loss.sum().backward()
    assert logp.grad.item() == 0.0  # the clip removes the incentive
    assert metrics["policy/clipfrac_high"].item() == 1.0


def test_dual_clip_seed_number():
    # (ii): A = -1, ratio 4, c = 3, eps 0.2 -> max(min(-4, -1.2), -3) = -3
    loss, logp, _ = _loss(ClippedSurrogate(eps_low=0.2, eps_high=0.2, dual_clip=3.0), 4.0, -1.0)
    assert -loss.item() == pytest.approx(-3.0, abs=1e-5)
    loss.sum().backward()
    assert logp.grad.item() == 0.0
    plain, _, _ = _loss(ClippedSurrogate(eps_low=0.2, eps_high=0.2), 4.0, -1.0)
    assert -plain.item() == pytest.approx(-4.0, abs=1e-5)  # without dual clip the bad token's loss is unbounded


def test_clip_higher_headroom_for_a_rare_token():
    # seeds: p_old = 0.01 can reach 0.012 with eps_high 0.2 and 0.0128 with 0.28
    for eps_high, ceiling in ((0.2, 0.012), (0.28, 0.0128)):
        assert 0.01 * (1 + eps_high) == pytest.approx(ceiling)
        inside, logp_in, _ = _loss(ClippedSurrogate(eps_high=eps_high), ceiling / 0.01 - 1e-4, 1.0)
        inside.sum().backward()
        assert logp_in.grad.item() != 0.0
        outside, logp_out, _ = _loss(ClippedSurrogate(eps_high=eps_high), ceiling / 0.01 + 1e-4, 1.0)
        outside.sum().backward()
        assert logp_out.grad.item() == 0.0


def test_on_policy_ratio_one_is_reinforce():
    torch.manual_seed(0)
    old = -torch.rand(3, 4)
    adv = torch.randn(3, 4)
    logp = old.clone().requires_grad_(True)
    loss, metrics = ClippedSurrogate()(logp, _batch(adv, old))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, -adv)
    assert metrics["policy/clipfrac"].item() == 0.0
    assert metrics["policy/approx_kl"].item() == pytest.approx(0.0, abs=1e-7)


def test_random_tensors_match_an_independent_formula():
    torch.manual_seed(1)
    old, new, adv = -torch.rand(4, 6) * 3, -torch.rand(4, 6) * 3, torch.randn(4, 6)
    loss, _ = ClippedSurrogate(eps_low=0.2, eps_high=0.28, dual_clip=3.0)(new, _batch(adv, old))
    r = torch.exp(new - old)
    standard = torch.min(r * adv, torch.clamp(r, 0.8, 1.28) * adv)
    expected = -torch.where(adv < 0, torch.max(standard, 3.0 * adv), standard)
    torch.testing.assert_close(loss, expected)


def test_gspo_sequence_ratio_is_the_geometric_mean():
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0]])
    new = torch.tensor([[-0.9, -2.2, -2.95], [-1.0, -1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
    surrogate = ClippedSurrogate(eps_low=3e-4, eps_high=4e-4, level="sequence")
    loss, _ = surrogate(new.requires_grad_(True), _batch(adv, old, mask))
    s0 = torch.exp(((new.detach() - old) * mask)[0].sum() / 3)  # (0.1 - 0.2 + 0.05) / 3 -> s < 1
    expected0 = -torch.min(s0 * 1.0, torch.clamp(s0, 1 - 3e-4, 1 + 4e-4) * 1.0)
    torch.testing.assert_close(loss[0], expected0.expand(3))
    torch.testing.assert_close(loss[1, :2], torch.tensor([1.0, 1.0]))  # ratio 1 (the masked token is ignored)


def test_every_option_changes_the_output():
    torch.manual_seed(2)
    old, new, adv = -torch.rand(4, 6) * 3, -torch.rand(4, 6) * 3, torch.randn(4, 6)
    variants = [
        ClippedSurrogate(),
        ClippedSurrogate(eps_low=0.1),
        ClippedSurrogate(eps_high=0.28),
        ClippedSurrogate(dual_clip=1.5),
        ClippedSurrogate(level="sequence"),
    ]
    outs = [v(new, _batch(adv, old))[0] for v in variants]
    for i in range(len(outs)):
        for j in range(i + 1, len(outs)):
            assert not torch.allclose(outs[i], outs[j]), (i, j)


def test_extreme_log_ratio_is_clamped_not_inf():
    loss, _ = ClippedSurrogate()(torch.tensor([[100.0]]), _batch([[-1.0]], torch.tensor([[-100.0]])))
    assert torch.isfinite(loss).all()
