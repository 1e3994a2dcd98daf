import pytest
import torch

from components.advantage import GroupNormalized
from tests.helpers import batch_from_scores


def _adv(estimator, scores, group_size, lengths=None):
    batch = batch_from_scores(scores, lengths=lengths, group_size=group_size)
    advantages, returns = estimator(batch)
    assert returns is None
    return advantages


def test_grpo_population_std_seed_numbers():
    # seeds, ch. 6.9 exercise 2: R = [1, 1, 1, 0] -> [0.5774, 0.5774, 0.5774, -1.7321]
    adv = _adv(GroupNormalized(), [1.0, 1.0, 1.0, 0.0], 4)
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5774, 0.5774, 0.5774, -1.7321]), atol=1e-4, rtol=0)


def test_dr_grpo_mean_only_seed_numbers():
    adv = _adv(GroupNormalized(scale="none"), [1.0, 1.0, 1.0, 0.0], 4)
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.25, 0.25, 0.25, -0.75]), atol=1e-6, rtol=0)


def test_grpo_half_split_population_and_bessel():
    # seeds, ch. 5.8 exercise 3: [1, 1, 0, 0] -> [1, 1, -1, -1]; with Bessel's std -> +-0.866
    pop = _adv(GroupNormalized(), [1.0, 1.0, 0.0, 0.0], 4)
    torch.testing.assert_close(pop[:, 0], torch.tensor([1.0, 1.0, -1.0, -1.0]), atol=1e-5, rtol=0)
    bessel = _adv(GroupNormalized(bessel=True), [1.0, 1.0, 0.0, 0.0], 4)
    torch.testing.assert_close(bessel[:, 0], torch.tensor([0.8660, 0.8660, -0.8660, -0.8660]), atol=1e-4, rtol=0)


def test_identical_rewards_give_exact_zero_not_nan():
    adv = _adv(GroupNormalized(), [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0], 4)
    assert torch.equal(adv, torch.zeros_like(adv))


def test_groups_are_independent_and_broadcast_to_valid_tokens():
    adv = _adv(GroupNormalized(), [1.0, 0.0, 5.0, 3.0], 2, lengths=[3, 1, 2, 2])
    # each group of 2 is +-1 whatever its scale; padding stays 0
    expected = torch.tensor([[1.0, 1.0, 1.0], [-1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_random_rederivation_matches_independent_formula():
    torch.manual_seed(0)
    scores = torch.randn(6 * 5)
    adv = _adv(GroupNormalized(eps=1e-6), scores, 5)[:, 0]
    g = scores.view(6, 5)
    ref = ((g - g.mean(1, keepdim=True)) / (g.std(1, unbiased=False, keepdim=True) + 1e-6)).flatten()
    torch.testing.assert_close(adv, ref, atol=1e-5, rtol=1e-5)


def test_scale_batch_divides_by_batch_std():
    scores = torch.tensor([1.0, 0.0, 3.0, 1.0])
    adv = _adv(GroupNormalized(scale="batch"), scores, 2)[:, 0]
    centered = torch.tensor([0.5, -0.5, 1.0, -1.0])
    torch.testing.assert_close(adv, centered / (scores.std(correction=0) + 1e-6), atol=1e-6, rtol=0)


def test_every_option_changes_the_output():
    scores = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5]
    outputs = [
        _adv(GroupNormalized(), scores, 4),
        _adv(GroupNormalized(scale="none"), scores, 4),
        _adv(GroupNormalized(scale="batch"), scores, 4),
        _adv(GroupNormalized(bessel=True), scores, 4),
        _adv(GroupNormalized(whiten="batch", shift_mean=False, scale="none"), scores, 4),
    ]
    for i in range(len(outputs)):
        for j in range(i + 1, len(outputs)):
            assert not torch.allclose(outputs[i], outputs[j]), (i, j)


def test_kl_in_reward_reaches_sequence_level_estimators():
    batch = batch_from_scores([1.0, 0.0], lengths=[2, 2], group_size=2)
    batch.token_rewards[0, 0] -= 0.5  # a KL-in-reward penalty on sample 0
    adv = GroupNormalized(scale="none")(batch).advantages[:, 0]
    torch.testing.assert_close(adv, torch.tensor([0.25, -0.25]))


def test_non_contiguous_groups_are_rejected():
    batch = batch_from_scores([1.0, 0.0, 1.0, 0.0], group_size=2)
    batch = batch.replace(group_ids=torch.tensor([0, 1, 0, 1]))
    with pytest.raises(ValueError, match="contiguous"):
        GroupNormalized()(batch)
