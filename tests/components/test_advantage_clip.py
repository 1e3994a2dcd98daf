"""Advantage clipping: |A| bounded after whitening, for every estimator."""

import math

import pytest
import torch

from components.advantage import GroupNormalized, LeaveOneOut
from tests.helpers import batch_from_scores


def test_group_normalized_clip_by_hand():
    # G = 4 scores [1, 0, 0, 0]: mean 0.25, population std sqrt(0.1875) = 0.4330
    # A = [0.75, -0.25, -0.25, -0.25] / 0.4330 = [1.7321, -0.5774, -0.5774, -0.5774]; clip 1.5 bounds the first only
    batch = batch_from_scores([1.0, 0.0, 0.0, 0.0], lengths=[2, 1, 2, 1], width=2, group_size=4)
    advantages, _ = GroupNormalized(eps=0.0, clip=1.5)(batch)
    unclipped = -0.25 / math.sqrt(0.1875)
    expected = torch.tensor([[1.5, 1.5], [unclipped, 0.0], [unclipped, unclipped], [unclipped, 0.0]])
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=0)


def test_clip_equals_clamp_of_the_unclipped_estimate_on_random_scores():
    torch.manual_seed(0)
    batch = batch_from_scores(torch.randn(16) * 3, lengths=torch.randint(1, 5, (16,)).tolist(), group_size=4)
    free, _ = LeaveOneOut()(batch)
    clipped, _ = LeaveOneOut(clip=0.7)(batch)
    torch.testing.assert_close(clipped, free.clamp(-0.7, 0.7))
    assert (free.abs() > 0.7).any()  # the bound is active somewhere


def test_clip_must_be_positive():
    with pytest.raises(ValueError, match="clip must be > 0"):
        GroupNormalized(clip=0.0)
