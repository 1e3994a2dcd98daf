"""Acceptance: a group with identical rewards contributes zero advantage and no NaN; a masked sample contributes nothing."""

import pytest
import torch

from components.advantage import GroupNormalized, LeaveOneOut, ReinforceBaseline, ReinforcePlusPlus, ReMax
from components.aggregator import TokenMean
from components.surrogate import CISPO, ClippedSurrogate, PolicyGradient
from tests.helpers import batch_from_scores

# estimators whose baseline is the prompt's group: a degenerate group is 0 whatever the rest of the batch holds
GROUP_BASELINES = {
    "rloo": LeaveOneOut,
    "reinforce_pp_baseline": lambda: ReinforcePlusPlus(group_baseline=True, whiten="none"),
    "remax": ReMax,
}
# estimators whose baseline is the whole batch: the batch is their group
BATCH_BASELINES = {
    "reinforce_batch": lambda: ReinforceBaseline(baseline="batch"),
    "reinforce_ema": ReinforceBaseline,
    "reinforce_pp": ReinforcePlusPlus,
    "reinforce_pp_batch_whiten": lambda: ReinforcePlusPlus(whiten="batch"),
}


def _batch(scores, group_size, greedy: bool, lengths=None):
    """Groups of ``group_size`` rows; with ``greedy`` a greedy row scoring like its group's first row is appended to each."""
    if not greedy:
        return batch_from_scores(scores, lengths=lengths, group_size=group_size)
    rows, flags, lens = [], [], []
    lengths = lengths or [1] * len(scores)
    for g in range(0, len(scores), group_size):
        rows += [*scores[g : g + group_size], scores[g]]
        lens += [*lengths[g : g + group_size], 1]
        flags += [False] * group_size + [True]
    is_greedy = torch.tensor(flags)
    return batch_from_scores(rows, lengths=lens, group_size=group_size + 1, is_greedy=is_greedy).replace(
        sample_mask=(~is_greedy).float()
    )


@pytest.mark.parametrize("value", [0.7, 1.0, 0.1, -0.45])
@pytest.mark.parametrize("name", sorted(GROUP_BASELINES))
def test_identical_group_is_exactly_zero(name, value):
    # non-dyadic rewards such as 0.7 make a float32 group mean inexact; the estimators must still give exact zeros
    greedy = name == "remax"
    batch = _batch([value] * 8 + [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5, 0.5], 8, greedy, lengths=[3] * 16)
    adv = GROUP_BASELINES[name]()(batch).advantages
    assert torch.isfinite(adv).all()
    rows = batch.group_ids == batch.group_ids[0]
    assert torch.equal(adv[rows], torch.zeros_like(adv[rows]))
    assert adv[~rows].abs().sum() > 0  # the informative group still has a signal


@pytest.mark.parametrize("value", [0.7, 1.0, 0.0])
@pytest.mark.parametrize("name", sorted(BATCH_BASELINES))
def test_identical_batch_is_exactly_zero_for_batch_baselines(name, value):
    adv = BATCH_BASELINES[name]()(_batch([value] * 8, 4, greedy=False, lengths=[2, 3] * 4)).advantages
    assert torch.isfinite(adv).all()
    assert torch.equal(adv, torch.zeros_like(adv))


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_group_normalized_identical_non_dyadic_group_is_zero(scale):
    batch = _batch([0.7] * 8 + [1.0, 0.0] * 4, 8, greedy=False)
    adv = GroupNormalized(scale=scale)(batch).advantages
    assert torch.equal(adv[:8], torch.zeros_like(adv[:8]))


@pytest.mark.parametrize("name", sorted({**GROUP_BASELINES, **BATCH_BASELINES}))
def test_a_response_with_no_valid_token_gets_no_advantage(name):
    estimator = {**GROUP_BASELINES, **BATCH_BASELINES}[name]()
    batch = _batch([1.0, 0.0, 0.5, 2.0], 4, greedy=name == "remax", lengths=[2, 0, 3, 1])
    adv = estimator(batch).advantages
    assert torch.isfinite(adv).all()
    assert torch.equal(adv[1], torch.zeros_like(adv[1]))


@pytest.mark.parametrize("name", ["reinforce_batch", "reinforce_pp", "reinforce_pp_batch_whiten"])
def test_a_masked_sample_does_not_move_the_batch_statistics(name):
    kept = BATCH_BASELINES[name]()(_batch([1.0, 0.0, 0.5, 2.0], 4, greedy=False, lengths=[2, 1, 3, 1])).advantages
    with_masked = _batch([1.0, 0.0, 0.5, 2.0, 100.0], 5, greedy=False, lengths=[2, 1, 3, 1, 3])
    with_masked.sample_mask[4] = 0  # e.g. truncated and filtered (mask_truncated)
    adv = BATCH_BASELINES[name]()(with_masked).advantages
    torch.testing.assert_close(adv[:4], kept)


@pytest.mark.parametrize("surrogate", [ClippedSurrogate(), CISPO(), PolicyGradient()], ids=["clipped", "cispo", "pg"])
def test_a_masked_sample_gets_no_gradient_and_leaves_the_loss_unchanged(surrogate):
    torch.manual_seed(0)
    batch = _batch([1.0, 0.0, 0.5, 2.0], 4, greedy=False, lengths=[2, 3, 3, 1])
    batch = batch.replace(advantages=LeaveOneOut()(batch).advantages, old_logprobs=-torch.rand(4, 3))
    batch.sample_mask[1] = 0
    logprobs = (batch.old_logprobs + 0.3 * torch.randn(4, 3)).requires_grad_(True)
    per_token, _ = surrogate(logprobs, batch)
    loss = TokenMean()(per_token, batch.loss_mask)
    loss.backward()
    assert torch.equal(logprobs.grad[1], torch.zeros(3))
    rest = [0, 2, 3]
    alone, _ = surrogate(logprobs.detach()[rest], batch.select(torch.tensor(rest)))
    torch.testing.assert_close(loss.detach(), TokenMean()(alone, batch.loss_mask[rest]))


@pytest.mark.parametrize("name", sorted({**GROUP_BASELINES, **BATCH_BASELINES}))
def test_an_empty_batch_gives_empty_advantages(name):
    # what the module estimates when dynamic sampling kept no group: the step is then skipped, not crashed
    batch = _batch([1.0, 0.0], 2, greedy=name == "remax")
    empty = batch.select(torch.zeros(batch.batch_size, dtype=torch.bool))
    adv = {**GROUP_BASELINES, **BATCH_BASELINES}[name]()(empty).advantages
    assert adv.shape == (0, batch.response_ids.shape[1])
