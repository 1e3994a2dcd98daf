"""`ImportanceSampling`, `DRO` and `StableReinforce` (the Tinker API's losses that had no component): hand-computed
values, an fp64 re-derivation on random tensors, and a test that every option changes the output."""

import math

import pytest
import torch

from components.surrogate import DRO, ClippedSurrogate, ImportanceSampling, OffPolicyCorrection, StableReinforce
from lightning_rl.core.batch import RolloutBatch


def _batch(advantages, old, mask=None, rollout=None):
    advantages = torch.as_tensor(advantages, dtype=torch.float32)
    mask = torch.ones_like(advantages, dtype=torch.long) if mask is None else torch.as_tensor(mask)
    return RolloutBatch(
        response_ids=torch.zeros_like(mask),
        response_mask=mask,
        advantages=advantages,
        old_logprobs=torch.as_tensor(old, dtype=torch.float32),
        rollout_logprobs=None if rollout is None else torch.as_tensor(rollout, dtype=torch.float32),
    )


def _one(surrogate, log_ratio, advantage, old=-1.0):
    """(d loss / d log pi, loss) of one token at the given log-ratio and advantage."""
    old_t = torch.tensor([[old]])
    logp = (old_t + log_ratio).requires_grad_(True)
    loss, _ = surrogate(logp, _batch([[advantage]], old_t))
    loss.sum().backward()
    return logp.grad.item(), loss.item()


def _random(seed, shape=(4, 7)):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(shape, generator=g) * 3
    new = old + (torch.rand(shape, generator=g) - 0.5) * 2
    adv = torch.randn(shape, generator=g)
    mask = (torch.rand(shape, generator=g) > 0.2).long()
    return old, new, adv, mask


# ------------------------------------------------------------------------------------------- importance sampling


def test_importance_sampling_by_hand():
    # r = 1.5, A = 2: loss -r A = -3, gradient d(-e^(lp - q) A)/d lp = -r A = -3
    assert _one(ImportanceSampling(), math.log(1.5), 2.0) == pytest.approx((-3.0, -3.0), abs=1e-6)
    # r = 0.5, A = -1: loss 0.5, gradient 0.5; no clip, unlike PPO which zeroes this token's gradient
    assert _one(ImportanceSampling(), math.log(0.5), -1.0) == pytest.approx((0.5, 0.5), abs=1e-6)
    assert _one(ClippedSurrogate(), math.log(0.5), -1.0)[0] == 0.0
    # on policy (r = 1) it is REINFORCE: gradient -A
    assert _one(ImportanceSampling(), 0.0, 0.7)[0] == pytest.approx(-0.7, abs=1e-7)


def test_importance_sampling_matches_an_fp64_rederivation():
    old, new, adv, mask = _random(0)
    logp = new.clone().requires_grad_(True)
    loss, metrics = ImportanceSampling()(logp, _batch(adv, old, mask))
    (loss * mask).sum().backward()
    new64 = new.double().requires_grad_(True)
    reference = -(torch.exp(new64 - old.double()) * adv.double() * mask).sum()
    reference.backward()
    torch.testing.assert_close(loss.double(), -torch.exp(new.double() - old.double()) * adv.double(), rtol=1e-6, atol=0)
    torch.testing.assert_close(logp.grad.double(), new64.grad, rtol=1e-6, atol=1e-7)
    ratio = torch.exp(new - old)
    assert metrics["policy/ratio_mean"].item() == pytest.approx(float((ratio * mask).sum() / mask.sum()), rel=1e-5)


def test_importance_sampling_correction_changes_the_output():
    old, new, adv, _ = _random(1)
    rollout = old - 0.7  # the sampler and the trainer disagree: w = e^0.7 = 2.01 > cap 2
    plain = ImportanceSampling()(new, _batch(adv, old, rollout=rollout))[0]
    corrected = ImportanceSampling(OffPolicyCorrection("tis", cap=1.5))(new, _batch(adv, old, rollout=rollout))[0]
    torch.testing.assert_close(corrected, plain * 1.5)


# ------------------------------------------------------------------------------------------------------------ DRO


def test_dro_by_hand():
    # beta 0.1, A 2, log pi -0.5, log q -1: loss -(2 * -0.5 - 0.05 * 0.25) = 1.0125; gradient -A + beta (lp - q) = -1.95
    grad, loss = _one(DRO(beta=0.1), 0.5, 2.0, old=-1.0)
    assert loss == pytest.approx(1.0125, abs=1e-6) and grad == pytest.approx(-1.95, abs=1e-6)
    # with A = 0 the gradient pulls log pi back to log q: beta (lp - q)
    assert _one(DRO(beta=0.1), -0.3, 0.0)[0] == pytest.approx(-0.03, abs=1e-7)


def test_dro_matches_an_fp64_rederivation():
    old, new, adv, mask = _random(2)
    logp = new.clone().requires_grad_(True)
    loss, _ = DRO(beta=0.3)(logp, _batch(adv, old, mask))
    (loss * mask).sum().backward()
    new64 = new.double().requires_grad_(True)
    (-(adv.double() * new64 - 0.15 * (new64 - old.double()).square()) * mask).sum().backward()
    torch.testing.assert_close(logp.grad.double(), new64.grad, rtol=1e-6, atol=1e-7)


def test_dro_beta_changes_the_output_and_must_be_positive():
    old, new, adv, _ = _random(3)
    assert not torch.allclose(DRO(beta=0.05)(new, _batch(adv, old))[0], DRO(beta=0.5)(new, _batch(adv, old))[0])
    with pytest.raises(ValueError, match="beta must be > 0"):
        DRO(beta=0.0)


# --------------------------------------------------------------------------------------------- StableReinforce


def test_stable_reinforce_pre_clip_bounds_the_loss_ppo_lets_explode():
    # log r = 5 with A = -1: PPO's min picks r A = -e^5 (loss 148.4, gradient 148.4); Pre-CLIP at b = 2 caps the loss at
    # e^2 = 7.389 and the token, outside [-b, b], has no gradient
    ppo_grad, ppo_loss = _one(ClippedSurrogate(), 5.0, -1.0)
    assert ppo_loss == pytest.approx(math.exp(5), rel=1e-5) and ppo_grad == pytest.approx(math.exp(5), rel=1e-5)
    grad, loss = _one(StableReinforce(pre_clip=2.0), 5.0, -1.0)
    assert loss == pytest.approx(math.exp(2), rel=1e-6) and grad == 0.0
    # inside the band it is PPO: log r = 0.1, A = 2 -> loss -e^0.1 2 (r < 1.2), gradient -e^0.1 2
    assert _one(StableReinforce(), 0.1, 2.0) == pytest.approx(_one(ClippedSurrogate(), 0.1, 2.0), rel=1e-6)


def test_stable_reinforce_advantage_filter_by_hand():
    # A = [1, 1, 1, 5]: mean 2, std sqrt(3) = 1.732; with k = 1 the 5 (3 from the mean) is dropped, the 1s (1 away) stay
    old = torch.full((1, 4), -1.0)
    logp = old.clone().requires_grad_(True)
    loss, metrics = StableReinforce(filter_sigmas=1.0)(logp, _batch([[1.0, 1.0, 1.0, 5.0]], old))
    loss.sum().backward()
    torch.testing.assert_close(loss, torch.tensor([[-1.0, -1.0, -1.0, 0.0]]))
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, -1.0, -1.0, 0.0]]))
    assert metrics["policy/filtered_frac"].item() == pytest.approx(0.25)
    # the 3-sigma rule keeps them all (4 tokens can never be 3 std from their mean)
    assert StableReinforce()(old, _batch([[1.0, 1.0, 1.0, 5.0]], old))[0][0, 3].item() == -5.0


def test_stable_reinforce_kl_term_by_hand():
    # kl_coeff 0.1 at log r = 0.5, A = 0: 0.1 (e^-0.5 - 1 + 0.5) = 0.0106531; gradient 0.1 (1 - e^-0.5) = 0.0393469
    grad, loss = _one(StableReinforce(kl_coeff=0.1), 0.5, 0.0)
    assert loss == pytest.approx(0.1 * (math.exp(-0.5) - 0.5), abs=1e-7)
    assert grad == pytest.approx(0.1 * (1 - math.exp(-0.5)), abs=1e-7)


def test_stable_reinforce_matches_an_fp64_rederivation():
    old, new, adv, mask = _random(4, (6, 9))
    new = new.clone()
    new[0, :3] = old[0, :3] + torch.tensor([3.0, -3.0, 1.9])  # two tokens past the pre-clip band, one inside
    adv[1, 2] = 12.0  # an outlier the 3-sigma rule drops
    surrogate = StableReinforce(eps_low=0.2, eps_high=0.28, pre_clip=2.0, filter_sigmas=3.0, kl_coeff=0.05)
    logp = new.clone().requires_grad_(True)
    loss, metrics = surrogate(logp, _batch(adv, old, mask))
    (loss * mask).sum().backward()
    m, a = mask.double(), adv.double()
    new64 = new.double().requires_grad_(True)
    d = (new64 - old.double()).clamp(-2.0, 2.0)
    mean = (a * m).sum() / m.sum()
    std = (((a - mean) ** 2 * m).sum() / m.sum()).sqrt()
    keep = ((a - mean).abs() <= 3 * std).double()
    r = d.exp()
    per_token = -keep * torch.minimum(r * a, r.clamp(0.8, 1.28) * a) + 0.05 * ((-d).exp() - 1 + d)
    (per_token * m).sum().backward()
    torch.testing.assert_close(loss.double(), per_token.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logp.grad.double(), new64.grad, rtol=1e-5, atol=1e-6)
    assert keep[1, 2] == 0 and metrics["policy/pre_clipped_frac"].item() > 0


@pytest.mark.parametrize(
    "option", [dict(eps_low=0.1), dict(eps_high=0.5), dict(pre_clip=0.3), dict(filter_sigmas=0.5), dict(kl_coeff=0.2)]
)
def test_stable_reinforce_every_option_changes_the_output(option):
    old, new, adv, _ = _random(5, (5, 8))
    new = old + (new - old) * 2  # ratios from e^-1 to e^1: every clip binds somewhere
    base = StableReinforce()(new, _batch(adv, old))[0]
    assert not torch.allclose(StableReinforce(**option)(new, _batch(adv, old))[0], base)
