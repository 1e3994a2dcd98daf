"""DecoupledClip (AReaL's decoupled PPO) against hand-computed values and an independent re-derivation."""

import math

import pytest
import torch

from components.surrogate import ClippedSurrogate, DecoupledClip, OffPolicyCorrection
from lightning_rl.core.batch import RolloutBatch


def _batch(theta, prox, behav, advantages):
    log = lambda p: torch.tensor([p]).log()  # noqa: E731
    logprobs = log(theta).requires_grad_()
    batch = RolloutBatch(
        response_ids=torch.ones(1, len(theta), dtype=torch.long),
        response_mask=torch.ones(1, len(theta), dtype=torch.long),
        old_logprobs=log(prox),
        rollout_logprobs=log(behav),
        advantages=torch.tensor([advantages]),
    )
    return logprobs, batch


# token 1: r = 0.5/0.4 = 1.25 clipped to 1.2 (A > 0), w = 0.4/0.32 = 1.25 -> loss -1.5, no gradient (clipped)
# token 2: r = 1, w = 0.3/0.5 = 0.6 -> loss -0.6, d loss / d log pi = -w r A = -0.6
# token 3: r = 0.22/0.25 = 0.88 (A < 0, inside the range), w = 0.25/0.1 = 2.5 > cap 2:
#          mask -> 0 and no gradient; truncate -> w = 2: loss 2 * 0.88 = 1.76, gradient 1.76
THETA, PROX, BEHAV, ADV = [0.5, 0.3, 0.22], [0.4, 0.3, 0.25], [0.32, 0.5, 0.1], [1.0, 1.0, -1.0]


@pytest.mark.parametrize("mode, loss3", [("mask", 0.0), ("truncate", 1.76)])
def test_hand_computed_values_and_gradients(mode, loss3):
    logprobs, batch = _batch(THETA, PROX, BEHAV, ADV)
    loss, metrics = DecoupledClip(eps_low=0.2, eps_high=0.2, behaviour_cap=2.0, behaviour_mode=mode)(logprobs, batch)
    assert loss[0].tolist() == pytest.approx([-1.5, -0.6, loss3], abs=1e-6)
    loss.sum().backward()
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, -0.6, loss3], abs=1e-6)
    assert float(metrics["policy/behaviour_capped_frac"]) == pytest.approx(1 / 3)
    assert float(metrics["policy/behaviour_weight_mean"]) == pytest.approx((1.25 + 0.6 + 2.5) / 3)


def test_fresh_samples_are_plain_ppo():
    """pi_behav = pi_prox: w = 1 and the loss is ClippedSurrogate's."""
    logprobs, batch = _batch(THETA, PROX, PROX, ADV)
    decoupled, _ = DecoupledClip(behaviour_cap=2.0)(logprobs, batch)
    plain, _ = ClippedSurrogate()(logprobs, batch)
    torch.testing.assert_close(decoupled, plain)


def test_random_tensors_match_an_independent_derivation():
    torch.manual_seed(0)
    b, r, eps_low, eps_high, cap = 4, 7, 0.2, 0.28, 1.5
    theta, prox, behav = (torch.randn(b, r) * 0.3 - 1.0 for _ in range(3))
    advantages, mask = torch.randn(b, r), (torch.rand(b, r) > 0.2).long()
    batch = RolloutBatch(
        response_ids=torch.ones(b, r, dtype=torch.long),
        response_mask=mask,
        old_logprobs=prox,
        rollout_logprobs=behav,
        advantages=advantages,
    )
    logprobs = theta.clone().requires_grad_()
    loss, _ = DecoupledClip(eps_low, eps_high, behaviour_cap=cap)(logprobs, batch)
    expected = torch.zeros(b, r)
    for i in range(b):
        for t in range(r):
            ratio = math.exp(theta[i, t] - prox[i, t])
            objective = min(ratio * advantages[i, t], min(max(ratio, 1 - eps_low), 1 + eps_high) * advantages[i, t])
            w = math.exp(prox[i, t] - behav[i, t]) if mask[i, t] else 1.0
            expected[i, t] = -(w if w <= cap else 0.0) * objective
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)


def test_a_correction_multiplies_on_top():
    logprobs, batch = _batch(THETA, PROX, BEHAV, ADV)
    sequence_reject = OffPolicyCorrection(
        mode="reject", cap=1.0, level="sequence"
    )  # product of w = 1.875 > 1: the sequence goes
    loss, _ = DecoupledClip(behaviour_cap=2.0, correction=sequence_reject)(logprobs, batch)
    assert loss.abs().sum() == 0


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="behaviour_cap"):
        DecoupledClip(behaviour_cap=0)
    with pytest.raises(ValueError, match="square it"):  # TIS/MIS weigh by the same pi_prox / pi_behav
        DecoupledClip(correction=OffPolicyCorrection(mode="tis"))
    assert "rollout_logprobs" in DecoupledClip().requires and "old_logprobs" in DecoupledClip().requires
