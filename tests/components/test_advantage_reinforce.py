import pytest
import torch

from components.advantage import ReinforceBaseline, ReinforcePlusPlus, reward_to_go
from lightning_rl.core.ops import masked_whiten
from tests.helpers import batch_from_scores


def _adv(estimator, scores, **kwargs):
    advantages, returns = estimator(batch_from_scores(scores, **kwargs))
    assert returns is None
    return advantages


# ----------------------------------------------------------------------------- ReinforceBaseline
def test_batch_mean_baseline():
    adv = _adv(ReinforceBaseline(baseline="batch"), [1.0, 0.0, 0.5, 0.5])
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, -0.5, 0.0, 0.0]))


def test_moving_average_uses_only_earlier_batches():
    est = ReinforceBaseline(baseline="ema", decay=0.9)
    # batch 1 has no history: its own mean 0.5 -> [0.5, -0.5]; average m1 = 0.5
    torch.testing.assert_close(_adv(est, [1.0, 0.0])[:, 0], torch.tensor([0.5, -0.5]))
    # batch 2 (mean 2) is scored against m1 = 0.5; m2 = 0.9 * 0.5 + 0.1 * 2 = 0.65
    torch.testing.assert_close(_adv(est, [2.0, 2.0])[:, 0], torch.tensor([1.5, 1.5]))
    # batch 3 against m2 = 0.65; m3 = 0.9 * 0.65 + 0.1 * 0.5 = 0.635
    torch.testing.assert_close(_adv(est, [0.0, 1.0])[:, 0], torch.tensor([-0.65, 0.35]))
    assert est.running_mean.item() == pytest.approx(0.635)
    assert est.batches_seen.item() == 3


def test_moving_average_survives_a_checkpoint():
    est = ReinforceBaseline(decay=0.8)
    for scores in ([1.0, 0.0], [3.0, 1.0]):
        _adv(est, scores)
    restored = ReinforceBaseline(decay=0.8)
    restored.load_state_dict(est.state_dict())
    torch.testing.assert_close(_adv(restored, [0.0, 0.0]), _adv(est, [0.0, 0.0]))
    # and the module's checkpoint carries it, since the estimator is a submodule of RLModule
    from lightning_rl.loop.module import RLModule

    state = RLModule(advantage=ReinforceBaseline()).state_dict()
    assert {"advantage.running_mean", "advantage.batches_seen"} <= set(state)


def test_masked_samples_stay_out_of_the_baseline():
    # sample 2 does not count in the loss (e.g. truncated with mask_truncated): its reward of 100 is not in the mean
    batch = batch_from_scores([1.0, 0.0, 100.0])
    batch.sample_mask[2] = 0
    adv = ReinforceBaseline(baseline="batch")(batch).advantages[:, 0]
    torch.testing.assert_close(adv[:2], torch.tensor([0.5, -0.5]))


def test_every_option_changes_the_output():
    def third_batch(est):  # decay first matters for the third batch's baseline
        _adv(est, [4.0, 0.0, 1.0])
        _adv(est, [2.0, 3.0, 1.0])
        return _adv(est, [1.0, 0.0, 0.5])

    outputs = [
        third_batch(ReinforceBaseline(baseline="batch")),
        third_batch(ReinforceBaseline(baseline="ema", decay=0.9)),
        third_batch(ReinforceBaseline(baseline="ema", decay=0.0)),
        third_batch(ReinforceBaseline(baseline="batch", whiten="batch")),
    ]
    for i in range(len(outputs)):
        for j in range(i + 1, len(outputs)):
            assert not torch.allclose(outputs[i], outputs[j]), (i, j)


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="baseline"):
        ReinforceBaseline(baseline="median")
    with pytest.raises(ValueError, match="decay"):
        ReinforceBaseline(decay=1.0)


# ----------------------------------------------------------------------------- ReinforcePlusPlus
def _kl_batch():
    # sample 0: 3 tokens, KL-in-reward penalties [-0.1, -0.2, -0.3], score 1 -> r = [-0.1, -0.2, 0.7]
    # sample 1: 2 tokens, no penalty, score 0
    batch = batch_from_scores([1.0, 0.0], lengths=[3, 2], group_size=2)
    batch.token_rewards[0] += torch.tensor([-0.1, -0.2, -0.3])
    return batch


def test_reward_to_go_hand_numbers():
    batch = _kl_batch()
    rtg = ReinforcePlusPlus(whiten="none")(batch).advantages
    torch.testing.assert_close(rtg, torch.tensor([[0.4, 0.5, 0.7], [0.0, 0.0, 0.0]]))
    # gamma 0.5: 0.7; -0.2 + 0.5 * 0.7 = 0.15; -0.1 + 0.5 * 0.15 = -0.025
    discounted = ReinforcePlusPlus(gamma=0.5, whiten="none")(batch).advantages
    torch.testing.assert_close(discounted[0], torch.tensor([-0.025, 0.15, 0.7]))


def test_group_baseline_subtracts_the_group_mean_return():
    # returns R = [0.4, 0.0], group mean 0.2
    adv = ReinforcePlusPlus(group_baseline=True, whiten="none")(_kl_batch()).advantages
    torch.testing.assert_close(adv, torch.tensor([[0.2, 0.3, 0.5], [-0.2, -0.2, 0.0]]))


def test_global_whitening_by_default():
    batch = _kl_batch()
    adv = ReinforcePlusPlus()(batch).advantages
    raw = torch.tensor([[0.4, 0.5, 0.7], [0.0, 0.0, 0.0]])
    mask = batch.response_mask.float()
    torch.testing.assert_close(adv, masked_whiten(raw, mask))
    valid = adv[mask.bool()]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert valid.std(correction=0).item() == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reward_to_go_random_rederivation(gamma):
    torch.manual_seed(3)
    lengths = torch.tensor([5, 1, 7, 3])
    mask = (torch.arange(7)[None] < lengths[:, None]).float()
    rewards = torch.randn(4, 7) * mask
    expected = torch.zeros(4, 7)
    for b in range(4):
        for t in range(int(lengths[b])):
            expected[b, t] = sum(gamma ** (k - t) * rewards[b, k] for k in range(t, int(lengths[b])))
    torch.testing.assert_close(reward_to_go(rewards, mask, gamma), expected, atol=1e-5, rtol=1e-5)


def test_reinforce_pp_every_option_changes_the_output():
    batch = _kl_batch()
    outputs = [
        ReinforcePlusPlus()(batch).advantages,
        ReinforcePlusPlus(whiten="none")(batch).advantages,
        ReinforcePlusPlus(gamma=0.5)(batch).advantages,
        ReinforcePlusPlus(group_baseline=True, whiten="none")(batch).advantages,
        ReinforcePlusPlus(shift_mean=False)(batch).advantages,
    ]
    for i in range(len(outputs)):
        for j in range(i + 1, len(outputs)):
            assert not torch.allclose(outputs[i], outputs[j]), (i, j)


def test_reinforce_pp_rejects_a_bad_gamma():
    with pytest.raises(ValueError, match="gamma"):
        ReinforcePlusPlus(gamma=0.0)
