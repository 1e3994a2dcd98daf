"""Shaped: static / running normalisation and clipping of any reward's scores, by hand."""

import math

import pytest
import torch

from components.reward import FunctionReward, Shaped
from lightning_rl.core.batch import RolloutBatch


def lengths_as_scores(completions, **_):
    return [float(len(c)) for c in completions]


def _call(reward, completions):
    batch = RolloutBatch(
        response_ids=torch.zeros(len(completions), 2, dtype=torch.long), response_mask=torch.ones(len(completions), 2)
    )
    return reward(batch.replace(columns={"completions": completions}))


def test_static_normalisation_then_clip():
    # scores 1, 2, 6: (r - 2) / 2 = -0.5, 0, 2 -> clipped at 1.5
    shaped = Shaped(FunctionReward(lengths_as_scores), normalize="static", mean=2.0, std=2.0, clip=1.5)
    torch.testing.assert_close(_call(shaped, ["a", "ab", "abcdef"]), torch.tensor([-0.5, 0.0, 1.5]))
    assert shaped.last_metrics["reward/raw_mean"].item() == pytest.approx(
        3.0
    )  # the raw score, logged beside the shaped one


def test_no_raw_score_metric_without_shaping():
    shaped = Shaped(FunctionReward(lengths_as_scores))
    _call(shaped, ["a"])
    assert shaped.last_metrics == {}


def test_running_statistics_over_batches_and_frozen_in_eval():
    shaped = Shaped(FunctionReward(lengths_as_scores), normalize="running")
    first = _call(shaped, ["a", "abc"])  # scores 1, 3: mu 2, sigma 1 -> -1, 1
    torch.testing.assert_close(first, torch.tensor([-1.0, 1.0]))
    second = _call(shaped, ["abcdef"])  # all seen: 1, 3, 6: mu 10/3, sigma^2 = (1 + 9 + 36) / 3 - (10/3)^2 = 38/9
    torch.testing.assert_close(second, torch.tensor([(6 - 10 / 3) / math.sqrt(38 / 9)]))
    shaped.eval()
    _call(shaped, ["abcdefghij"])
    assert float(shaped.running_count) == 3  # validation does not move the statistics
    assert sorted(n for n, _ in shaped.named_buffers()) == ["running_count", "running_m2", "running_mean"]


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="Shaped: normalize must be"):
        Shaped(FunctionReward(lengths_as_scores), normalize="zscore")
    with pytest.raises(ValueError, match="clip > 0"):
        Shaped(FunctionReward(lengths_as_scores), clip=-1.0)


def fixed_scores(completions, **_):
    return [{"half": 0.5, "none": 0.0, "full": 1.0, "two": 2.0}[c] for c in completions]


def test_running_normalisation_is_the_identity_until_the_statistics_have_a_spread():
    # issue 24: in eval mode before any training batch, std 0 was clamped to 1e-6 and [0.5, 0, 1] became [5e5, 0, 1e6]
    shaped = Shaped(FunctionReward(fixed_scores), normalize="running").eval()
    torch.testing.assert_close(_call(shaped, ["half", "none", "full"]), torch.tensor([0.5, 0.0, 1.0]))
    # statistics of equal scores only (every score 2 so far): the mean is subtracted, sigma is 1 until a spread is seen
    shaped.train()
    torch.testing.assert_close(_call(shaped, ["two", "two"]), torch.tensor([0.0, 0.0]))
    shaped.eval()
    torch.testing.assert_close(_call(shaped, ["half", "none", "full"]), torch.tensor([-1.5, -2.0, -1.0]))


def test_raw_scores_skip_every_shaping_even_inside_a_composite():
    from components.reward import Composite
    from lightning_rl.core.contracts import raw_scores

    shaped = Shaped(FunctionReward(fixed_scores), normalize="static", mean=1.0, std=0.5, clip=0.5)
    torch.testing.assert_close(_call(shaped, ["half", "full", "two"]), torch.tensor([-0.5, 0.0, 0.5]))
    composite = Composite([shaped, FunctionReward(fixed_scores)], weights=[1.0, 2.0])
    with raw_scores():
        torch.testing.assert_close(_call(shaped, ["half", "full", "two"]), torch.tensor([0.5, 1.0, 2.0]))
        torch.testing.assert_close(_call(composite, ["half", "full"]), torch.tensor([1.5, 3.0]))
    torch.testing.assert_close(
        _call(shaped, ["half", "full", "two"]), torch.tensor([-0.5, 0.0, 0.5])
    )  # shaped again after
    running = Shaped(FunctionReward(fixed_scores), normalize="running")
    with raw_scores():
        _call(running, ["half", "two"])
    assert float(running.running_count) == 0  # raw scores are not training's: the statistics do not see them


def test_the_running_statistics_of_a_composites_parts_are_state():
    """#46 item 4: a Composite held its parts in a plain list: Composite([Shaped(running)]) had 0 state_dict keys, so a
    resumed run restarted its statistics. Its module parts are submodules now, wrapped in a Shaped or a
    MissingEOSPenalty too, and train / eval mode reaches them."""
    from components.reward import Composite, MissingEOSPenalty

    def build():
        return Shaped(
            Composite([Shaped(FunctionReward(lengths_as_scores), normalize="running"), FunctionReward(fixed_scores)])
        )

    straight = build()
    stats = [f"running_{s}" for s in ("count", "mean", "m2")]
    assert list(straight.state_dict()) == stats + [
        f"reward.parts.0.{s}" for s in stats
    ]  # the outer Shaped's, the part's
    _call(straight, ["two", "half"])  # lengths 3, 4: count 2, mean 3.5, M2 0.5
    resumed = build()
    resumed.load_state_dict(straight.state_dict())
    part = resumed.reward.rewards[0]
    assert (float(part.running_count), float(part.running_mean), float(part.running_m2)) == (2.0, 3.5, 0.5)
    resumed.eval()
    assert not part.training
    _call(resumed, ["full"])
    assert float(part.running_count) == 2.0  # eval: the statistics stay
    wrapped = MissingEOSPenalty(Shaped(FunctionReward(lengths_as_scores), normalize="running"))
    assert list(wrapped.state_dict()) == [f"reward.{s}" for s in stats]
