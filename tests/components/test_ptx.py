"""PPO-ptx: gamma * token-mean NLL of pretraining text, by hand and against cross-entropy; end to end through the CLI."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from components.ptx import PretrainMix


class FixedLogits(nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.logits = nn.Parameter(logits)

    def forward(self, input_ids, attention_mask, position_ids, use_cache):
        return SimpleNamespace(logits=self.logits)


def test_nll_by_hand():
    # one left-padded row [pad, 1, 2]: the only predicted token is 2 from position 1, whose logits
    # [0, 0, ln 2] give p(2) = 2 / (1 + 1 + 2) = 0.5; the pad -> 1 pair does not count
    logits = torch.zeros(1, 3, 3)
    logits[0, 1] = torch.tensor([0.0, 0.0, math.log(2.0)])
    logits[0, 0] = torch.tensor([9.0, -9.0, -9.0])  # would be a huge NLL if the padded pair counted
    loss, metrics = PretrainMix(coef=0.5).loss(FixedLogits(logits), torch.tensor([[0, 1, 2]]), torch.tensor([[0, 1, 1]]))
    assert loss.item() == pytest.approx(0.5 * math.log(2.0), rel=1e-6)
    assert metrics["ptx/nll"].item() == pytest.approx(math.log(2.0), rel=1e-6)


def test_matches_cross_entropy_on_random_text_and_has_its_gradient():
    torch.manual_seed(0)
    n, length, vocab = 3, 7, 11
    ids = torch.randint(0, vocab, (n, length))
    mask = torch.ones(n, length, dtype=torch.long)
    mask[0, :2] = 0  # left padding
    mask[2, :4] = 0
    model = FixedLogits(torch.randn(n, length, vocab))
    loss, _ = PretrainMix(coef=2.0).loss(model, ids, mask)
    loss.backward()
    # independent: cross-entropy over the (context, target) pairs that are both text
    logits, targets = model.logits[:, :-1], ids[:, 1:]
    keep = (mask[:, :-1] * mask[:, 1:]).bool()
    expected = 2.0 * nn.functional.cross_entropy(logits[keep], targets[keep])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert model.logits.grad[0, :2].abs().sum() == 0  # padding positions get no gradient


def test_coef_must_be_non_negative():
    with pytest.raises(ValueError, match="coef"):
        PretrainMix(coef=-1.0)
