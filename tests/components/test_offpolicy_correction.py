"""TIS / MIS, token and sequence level, by hand; applied through every surrogate."""

import math

import pytest
import torch

from components.surrogate import CISPO, ClippedSurrogate, OffPolicyCorrection, PolicyGradient
from lightning_rl.core.batch import RolloutBatch

# w = pi_old(trainer) / pi_rollout(sampler) per token; row 1's last token is padding (its w of 100 must be ignored)
W = torch.tensor([[3.0, 0.5, 1.5], [1.2, 0.25, 100.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def _batch(advantages=None):
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.5, -3.0]])
    return RolloutBatch(
        response_ids=torch.zeros_like(MASK),
        response_mask=MASK,
        old_logprobs=old,
        rollout_logprobs=old - W.log(),
        advantages=torch.ones(2, 3) if advantages is None else advantages,
    )


@pytest.mark.parametrize(
    "correction, expected",
    [
        # token TIS: min(w, 2)
        (OffPolicyCorrection("tis", cap=2.0), [[2.0, 0.5, 1.5], [1.2, 0.25, 1.0]]),
        # token MIS: w * 1[w <= 2] (and, with lower=0.6, 1[w >= 0.6]): the kept tokens keep their weight
        (OffPolicyCorrection("mis", cap=2.0), [[0.0, 0.5, 1.5], [1.2, 0.25, 1.0]]),
        (OffPolicyCorrection("mis", cap=2.0, lower=0.6), [[0.0, 0.0, 1.5], [1.2, 0.0, 1.0]]),
        # pure rejection: the same tokens dropped, the kept ones weighted 1
        (OffPolicyCorrection("reject", cap=2.0), [[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]]),
        (OffPolicyCorrection("reject", cap=2.0, lower=0.6), [[0.0, 0.0, 1.0], [1.0, 0.0, 1.0]]),
        # sequence level: w_seq = 3 * 0.5 * 1.5 = 2.25 and 1.2 * 0.25 = 0.3 (padding excluded)
        (OffPolicyCorrection("tis", cap=2.0, level="sequence"), [[2.0, 2.0, 2.0], [0.3, 0.3, 0.3]]),
        (OffPolicyCorrection("mis", cap=2.0, level="sequence"), [[0.0, 0.0, 0.0], [0.3, 0.3, 0.3]]),
        (OffPolicyCorrection("mis", cap=3.0, lower=0.5, level="sequence"), [[2.25, 2.25, 2.25], [0.0, 0.0, 0.0]]),
        (OffPolicyCorrection("reject", cap=3.0, lower=0.5, level="sequence"), [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]),
        # geometric: (3 * 0.5 * 1.5)^(1/3) = 1.3104 kept in [0.6, 2]; (1.2 * 0.25)^(1/2) = 0.5477 < 0.6 dropped whole;
        # the kept sequence's tokens keep their own w (mis), even the 3 a token-level mask would drop
        (OffPolicyCorrection("mis", cap=2.0, lower=0.6, level="geometric"), [[3.0, 0.5, 1.5], [0.0, 0.0, 0.0]]),
        (OffPolicyCorrection("reject", cap=2.0, lower=0.6, level="geometric"), [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]),
        # a band that 1.3104 leaves (cap 1.3) and 0.5477 keeps (lower 0.5)
        (OffPolicyCorrection("mis", cap=1.3, lower=0.5, level="geometric"), [[0.0, 0.0, 0.0], [1.2, 0.25, 0.0]]),
    ],
    ids=[
        "tis-token",
        "mis-token",
        "mis-token-lower",
        "reject-token",
        "reject-token-lower",
        "tis-seq",
        "mis-seq",
        "mis-seq-lower",
        "reject-seq-lower",
        "mis-geo",
        "reject-geo",
        "mis-geo-band",
    ],
)
def test_weights_by_hand(correction, expected):
    weight, _ = correction(_batch())
    valid = MASK.bool()
    torch.testing.assert_close(weight[valid], torch.tensor(expected)[valid], atol=1e-5, rtol=0)
    assert not weight.requires_grad


def test_mis_keeps_the_importance_weight_of_kept_tokens():
    # masked importance sampling is w * 1[w <= C]: with C = 2 none of these is masked, so the weights are w itself
    w = torch.tensor([[0.832, 0.731, 0.685, 1.308]])
    old = torch.tensor([[-0.4, -1.1, -2.0, -0.3]])
    batch = RolloutBatch(
        response_ids=torch.zeros(1, 4, dtype=torch.long),
        response_mask=torch.ones(1, 4),
        old_logprobs=old,
        rollout_logprobs=old - w.log(),
    )
    weight, _ = OffPolicyCorrection("mis", cap=2.0)(batch)
    torch.testing.assert_close(weight, w, atol=1e-6, rtol=0)
    weight, _ = OffPolicyCorrection("reject", cap=2.0)(batch)
    torch.testing.assert_close(weight, torch.ones(1, 4))


def test_metrics_by_hand():
    _, metrics = OffPolicyCorrection("tis", cap=2.0)(_batch())
    assert metrics["offpolicy/weight_mean"].item() == pytest.approx((3 + 0.5 + 1.5 + 1.2 + 0.25) / 5, abs=1e-5)
    assert metrics["offpolicy/affected_frac"].item() == pytest.approx(1 / 5)
    _, metrics = OffPolicyCorrection("mis", cap=2.0, lower=0.6)(_batch())
    assert metrics["offpolicy/affected_frac"].item() == pytest.approx(3 / 5)  # 3 above the cap, 0.5 and 0.25 below 0.6


@pytest.mark.parametrize("surrogate_cls", [PolicyGradient, CISPO, ClippedSurrogate], ids=["pg", "cispo", "clipped"])
def test_every_surrogate_scales_its_gradient_by_the_weight(surrogate_cls):
    # on policy (pi_theta = pi_old, ratio 1) every surrogate's gradient is -A; the correction multiplies it by its weight
    correction = OffPolicyCorrection("tis", cap=2.0)
    batch = _batch(advantages=torch.tensor([[1.0, -2.0, 0.5], [3.0, 1.0, 0.0]]))
    logp = batch.old_logprobs.clone().requires_grad_(True)
    loss, metrics = surrogate_cls(correction=correction)(logp, batch)
    (loss * MASK).sum().backward()
    weight = torch.tensor([[2.0, 0.5, 1.5], [1.2, 0.25, 1.0]])
    torch.testing.assert_close(logp.grad, -batch.advantages * weight * MASK, atol=1e-5, rtol=0)
    assert "offpolicy/weight_mean" in metrics


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError):
        OffPolicyCorrection("is")
    with pytest.raises(ValueError):
        OffPolicyCorrection(level="batch")
    with pytest.raises(ValueError, match="cap"):
        OffPolicyCorrection(cap=0.0)


def test_a_rollout_without_sampler_logprobs_fails_at_construction():
    from components.rollout import HFRollout
    from lightning_rl.loop.module import RLModule

    with pytest.raises(ValueError, match="return_logprobs"):
        RLModule(rollout=HFRollout(group_size=2), surrogate=PolicyGradient(correction=OffPolicyCorrection()))
    RLModule(
        rollout=HFRollout(group_size=2, return_logprobs=True),
        surrogate=CISPO(correction=OffPolicyCorrection("mis", level="sequence")),
    )


def test_sequence_weight_is_the_product_of_token_weights():
    torch.manual_seed(0)
    log_w = (torch.rand(3, 4) - 0.5) * 0.4
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    batch = RolloutBatch(
        response_ids=torch.zeros_like(mask), response_mask=mask, old_logprobs=log_w, rollout_logprobs=torch.zeros(3, 4)
    )
    weight, _ = OffPolicyCorrection("tis", cap=10.0, level="sequence")(batch)
    for b in range(3):
        product = math.prod(math.exp(float(log_w[b, t])) for t in range(int(mask[b].sum())))
        assert weight[b, 0].item() == pytest.approx(product, rel=1e-5)
