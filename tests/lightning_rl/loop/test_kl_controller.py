"""The adaptive KL controller averages the sequence KL over the samples that count (not greedy baseline rows,
not sample_mask = 0 rows), and counts only those in n."""

from types import SimpleNamespace

import pytest
import torch

from components.kl import KLRegularizer
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.loop.optimize import PolicyUpdate


def _batch():
    # rows 0, 1: sampled, sequence KL 3 x 0.0625 = 0.1875; row 2: a ReMax greedy row; row 3: sample_mask = 0
    ref = torch.full((4, 3), -1.0)
    old = ref + torch.tensor([[0.0625], [0.0625], [0.05], [0.3]])
    return RolloutBatch(
        response_ids=torch.zeros(4, 3, dtype=torch.long),
        response_mask=torch.ones(4, 3),
        old_logprobs=old,
        ref_logprobs=ref,
        sample_mask=torch.tensor([1.0, 1.0, 0.0, 0.0]),
        is_greedy=torch.tensor([0, 0, 1, 0]),
    )


def test_counted_samples():
    torch.testing.assert_close(_batch().counted, torch.tensor([1.0, 1.0, 0.0, 0.0]))


def test_controller_sees_the_mean_over_counted_samples_and_raises_beta():
    kl = KLRegularizer(coef=0.1, placement="reward", target=0.18, horizon=10)
    PolicyUpdate.update_kl(SimpleNamespace(kl=kl), _batch())
    # KL 0.1875 over n = 2: error = 0.1875 / 0.18 - 1 = 0.041667, beta *= 1 + 0.041667 * 2 / 10
    # (dividing by all 4 rows, the controller saw 0.094 and lowered beta)
    assert float(kl.coef) == pytest.approx(0.1 * (1 + (0.1875 / 0.18 - 1) * 2 / 10), rel=1e-9)
    assert float(kl.coef) > 0.1
