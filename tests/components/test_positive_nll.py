import pytest
import torch

from components.aggregator import TokenMean
from components.loss_terms import PositiveNLL
from lightning_rl.core.forward_outputs import PolicyForward
from tests.helpers import batch_from_scores


def test_hand_computed_values():
    # scores [1, 0, -1]: only sample 0 is positive (threshold 0); -0.1 * log p on its valid tokens
    batch = batch_from_scores([1.0, 0.0, -1.0], lengths=[2, 3, 1], width=3)
    logprobs = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]))
    term = PositiveNLL(coef=0.1)(PolicyForward(logprobs), batch)
    expected = torch.tensor([[0.1 * 0.6931472, 0.1 * 1.3862944, 0.1 * 0.1053605], [0.0] * 3, [0.0] * 3])
    torch.testing.assert_close(term, expected, atol=1e-6, rtol=0)
    # the aggregator reduces it with everything else: TokenMean over the 6 valid tokens
    loss = TokenMean()(term, batch.loss_mask)
    assert float(loss) == pytest.approx(0.1 * (0.6931472 + 1.3862944) / 6, abs=1e-6)


def test_gradient_is_the_lm_gradient_on_positive_samples_only():
    batch = batch_from_scores([1.0, 0.0], lengths=[2, 2])
    logits = torch.randn(2, 2, 5, requires_grad=True)
    logprobs = torch.log_softmax(logits, -1).gather(-1, batch.response_ids.clamp_max(4)[..., None]).squeeze(-1)
    TokenMean()(PositiveNLL(coef=1.0)(PolicyForward(logprobs), batch), batch.loss_mask).backward()
    assert logits.grad[0].abs().sum() > 0 and torch.equal(logits.grad[1], torch.zeros(2, 5))


def test_every_option_changes_the_output():
    batch = batch_from_scores([1.0, 0.4, 0.0], lengths=[2, 2, 2])
    logprobs = -torch.rand(3, 2) - 0.1
    base = PositiveNLL()(PolicyForward(logprobs), batch)
    assert not torch.allclose(PositiveNLL(coef=0.5)(PolicyForward(logprobs), batch), base)
    assert not torch.allclose(PositiveNLL(threshold=0.5)(PolicyForward(logprobs), batch), base)
    assert PositiveNLL.requires == frozenset({"scores"})
