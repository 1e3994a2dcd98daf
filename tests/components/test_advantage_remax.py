import pytest
import torch

from components.advantage import ReMax
from components.rollout import HFRollout
from tests.helpers import batch_from_scores


def _remax_batch(sampled, greedy, lengths=None):
    """Groups of len(sampled[k]) sampled rows followed by one greedy row, as HFRollout(greedy_baseline=True) lays them out."""
    scores, flags = [], []
    for rows, baseline in zip(sampled, greedy):
        scores += [*rows, baseline]
        flags += [False] * len(rows) + [True]
    is_greedy = torch.tensor(flags)
    return batch_from_scores(scores, lengths=lengths, group_size=len(sampled[0]) + 1, is_greedy=is_greedy).replace(
        sample_mask=(~is_greedy).float()
    )


def test_baseline_is_the_greedy_score_and_greedy_rows_get_zero():
    batch = _remax_batch([[1.0, 0.0], [0.0, 0.0]], greedy=[0.5, 1.0])
    adv = ReMax()(batch).advantages[:, 0]
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.0, -1.0, -1.0, 0.0]))


def test_sampled_returns_carry_the_kl_penalty_the_baseline_is_the_score():
    batch = _remax_batch([[1.0, 0.0]], greedy=[0.5], lengths=[2, 2, 2])
    batch.token_rewards[:, 0] -= torch.tensor([0.25, 0.0, 0.125])  # KL-in-reward on sampled row 0 and the greedy row
    adv = ReMax()(batch).advantages
    torch.testing.assert_close(adv, torch.tensor([[0.25, 0.25], [-0.5, -0.5], [0.0, 0.0]]))


def test_random_rederivation():
    torch.manual_seed(0)
    sampled, greedy = torch.randn(4, 3), torch.randn(4)
    batch = _remax_batch(sampled.tolist(), greedy.tolist())
    adv = ReMax()(batch).advantages[:, 0].view(4, 4)
    torch.testing.assert_close(adv[:, :3], sampled - greedy[:, None])
    assert torch.equal(adv[:, 3], torch.zeros(4))


def test_whitening_skips_the_greedy_rows():
    batch = _remax_batch([[1.0, 0.0, 3.0], [0.0, 2.0, 0.0]], greedy=[0.5, 1.0])
    adv = ReMax(whiten="batch")(batch).advantages[:, 0]
    sampled = adv[~batch.is_greedy]
    assert sampled.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert sampled.std(correction=0).item() == pytest.approx(1.0, abs=1e-4)
    assert torch.equal(adv[batch.is_greedy], torch.zeros(2))


def test_without_greedy_rows_the_error_names_the_rollout_option():
    batch = batch_from_scores([1.0, 0.0], group_size=2)
    with pytest.raises(ValueError, match="greedy_baseline"):
        ReMax()(batch)
    with pytest.raises(ValueError, match="greedy_baseline"):
        ReMax()(batch.replace(is_greedy=torch.tensor([False, False])))


def test_a_group_with_two_greedy_rows_is_rejected():
    batch = _remax_batch([[1.0, 0.0]], greedy=[0.5]).replace(is_greedy=torch.tensor([False, True, True]))
    with pytest.raises(ValueError, match="exactly one greedy row"):
        ReMax()(batch)


def test_config_without_greedy_rollout_fails_at_construction():
    from lightning_rl.loop.module import RLModule

    with pytest.raises(ValueError, match="greedy_baseline"):
        RLModule(rollout=HFRollout(group_size=2), advantage=ReMax())
    RLModule(rollout=HFRollout(group_size=2, greedy_baseline=True), advantage=ReMax())
