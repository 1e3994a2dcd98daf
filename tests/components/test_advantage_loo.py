import pytest
import torch

from components.advantage import GroupNormalized, LeaveOneOut
from tests.helpers import batch_from_scores


def _adv(estimator, scores, group_size, lengths=None):
    advantages, returns = estimator(batch_from_scores(scores, lengths=lengths, group_size=group_size))
    assert returns is None
    return advantages


def test_rloo_seed_numbers_sum_to_zero_and_match_the_rescaled_group_mean():
    # seeds, ch. 5.8 exercise 2: R = [1.2, 0.2, 1.2, 0.0]; b_i = mean of the other three
    # b = [0.4667, 0.8, 0.4667, 0.8667] -> A = [0.7333, -0.6, 0.7333, -0.8667]
    rewards = torch.tensor([1.2, 0.2, 1.2, 0.0])
    adv = _adv(LeaveOneOut(), rewards, 4)[:, 0]
    torch.testing.assert_close(adv, torch.tensor([0.7333, -0.6, 0.7333, -0.8667]), atol=1e-4, rtol=0)
    assert adv.sum().item() == pytest.approx(0.0, abs=1e-6)
    torch.testing.assert_close(adv, 4 / 3 * (rewards - rewards.mean()), atol=1e-6, rtol=0)
    # and it is Dr. GRPO's mean-only advantage times G / (G - 1)
    torch.testing.assert_close(adv, 4 / 3 * _adv(GroupNormalized(scale="none"), rewards, 4)[:, 0], atol=1e-6, rtol=0)


def test_random_rederivation_from_the_definition():
    torch.manual_seed(0)
    scores = torch.randn(5 * 6)
    adv = _adv(LeaveOneOut(), scores, 6)[:, 0]
    expected = torch.empty_like(scores)
    for i in range(scores.numel()):
        group = scores[(i // 6) * 6 : (i // 6 + 1) * 6]
        others = torch.cat([group[: i % 6], group[i % 6 + 1 :]])
        expected[i] = scores[i] - others.mean()
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)


def test_broadcast_to_valid_tokens_only():
    adv = _adv(LeaveOneOut(), [1.0, 0.0], 2, lengths=[3, 1])
    torch.testing.assert_close(adv, torch.tensor([[1.0, 1.0, 1.0], [-1.0, 0.0, 0.0]]))


def test_kl_in_reward_enters_the_return():
    batch = batch_from_scores([1.0, 0.0], lengths=[2, 2], group_size=2)
    batch.token_rewards[0, 0] -= 0.5  # KL-in-reward penalty on sample 0: returns 0.5 and 0
    torch.testing.assert_close(LeaveOneOut()(batch).advantages[:, 0], torch.tensor([0.5, -0.5]))


def test_whitening_option_changes_the_output():
    scores = [1.0, 0.0, 0.0, 0.0, 3.0, 1.0, 0.0, 0.5]
    plain = _adv(LeaveOneOut(), scores, 4)
    whitened = _adv(LeaveOneOut(whiten="batch"), scores, 4)
    assert not torch.allclose(plain, whitened)
    assert whitened[:, 0].std(correction=0).item() == pytest.approx(1.0, abs=1e-4)


def test_needs_two_samples_per_prompt_and_rejects_greedy_rows():
    with pytest.raises(ValueError, match="group_size >= 2"):
        _adv(LeaveOneOut(), [1.0, 0.0], 1)
    batch = batch_from_scores([1.0, 0.0, 0.5], group_size=3, is_greedy=torch.tensor([False, False, True]))
    with pytest.raises(ValueError, match="ReMax"):
        LeaveOneOut()(batch)
