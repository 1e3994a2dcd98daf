import pytest
import torch

from components.aggregator import SeqMeanTokenMean, SeqMeanTokenSum, TokenMean, TokenSum, TokenSumNorm


def _mask(lengths, width):
    lengths = torch.as_tensor(lengths)
    return (torch.arange(width)[None] < lengths[:, None]).float()


def test_seed_weight_table():
    # seeds, ch. "from PPO to GRPO": rewards [1, 0, 0, 1], lengths [200, 50, 2000, 400], Bessel-std GRPO advantages
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    lengths = torch.tensor([200, 50, 2000, 400])
    mask = _mask(lengths, 2000)
    # a token's weight in the loss is A_i times its aggregation weight over the normaliser
    seq = SeqMeanTokenMean()
    weights_seq = (adv[:, None] * seq.weights(mask) / seq.denominator(mask))[:, 0]
    torch.testing.assert_close(weights_seq, torch.tensor([1.083e-3, -4.330e-3, -1.083e-4, 5.413e-4]), rtol=1e-3, atol=0)
    tok = TokenMean()
    weights_tok = (adv[:, None] * tok.weights(mask) / tok.denominator(mask))[:, 0]
    torch.testing.assert_close(weights_tok, torch.tensor([3.268e-4, -3.268e-4, -3.268e-4, 3.268e-4]), rtol=1e-3, atol=0)


@pytest.mark.parametrize(
    "aggregator", [TokenMean(), SeqMeanTokenMean(), SeqMeanTokenSum(), TokenSumNorm(16.0), TokenSum()]
)
def test_whole_batch_equals_micro_batches_with_accumulation(aggregator):
    torch.manual_seed(0)
    mask = _mask([5, 1, 0, 7, 3, 2], 7)
    weight = torch.randn(6, 7, requires_grad=True)
    whole = aggregator(weight.square(), mask)
    (g_whole,) = torch.autograd.grad(whole, weight)
    total = aggregator.denominator(mask)
    parts = [aggregator(weight[i : i + 2].square(), mask[i : i + 2], total) for i in range(0, 6, 2)]
    (g_parts,) = torch.autograd.grad(sum(parts), weight)
    torch.testing.assert_close(sum(parts), whole)
    torch.testing.assert_close(g_parts, g_whole)


@pytest.mark.parametrize("aggregator", [TokenMean(), SeqMeanTokenMean(), SeqMeanTokenSum(), TokenSumNorm(16.0)])
def test_split_across_ranks_with_gradient_averaging_equals_whole(aggregator):
    """Rank r computes its loss with total = global / world; DDP averages the rank gradients."""
    torch.manual_seed(1)
    mask = _mask([4, 2, 6, 1, 3, 5, 2, 2], 6)
    weight = torch.randn(8, 6, requires_grad=True)
    whole = aggregator(weight.square(), mask)
    (g_whole,) = torch.autograd.grad(whole, weight)
    world = 2
    total = aggregator.denominator(mask) / world
    shards = [slice(0, 4), slice(4, 8)]
    losses = [aggregator(weight[s].square(), mask[s], total) for s in shards]
    (g_avg,) = torch.autograd.grad(sum(losses) / world, weight)
    torch.testing.assert_close(sum(losses) / world, whole)
    torch.testing.assert_close(g_avg, g_whole)


def test_hand_values():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert TokenMean()(loss, mask).item() == pytest.approx(10 / 4)
    assert SeqMeanTokenMean()(loss, mask).item() == pytest.approx((2 + 4) / 2)
    assert SeqMeanTokenSum()(loss, mask).item() == pytest.approx((6 + 4) / 2)
    assert TokenSumNorm(10.0)(loss, mask).item() == pytest.approx((6 + 4) / 10 / 2)
    assert TokenSum()(loss, mask).item() == pytest.approx(6 + 4)


def test_all_masked_sample_contributes_nothing_and_empty_batch_is_zero():
    loss = torch.tensor([[1.0, 2.0], [100.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    for agg in (TokenMean(), SeqMeanTokenMean(), SeqMeanTokenSum(), TokenSumNorm(2.0), TokenSum()):
        assert agg(loss, mask).item() == pytest.approx(agg(loss[:1], mask[:1]).item())
        assert agg(loss, torch.zeros_like(mask)).item() == 0.0


def test_token_sum_is_the_plain_sum_and_data_parallel_divides_it_by_the_ranks():
    """TokenSum against an fp64 sum on random tensors; split over 2 ranks whose gradients DDP averages, the update is
    the whole sum's over 2 (the factor its docstring names), whatever the split."""
    torch.manual_seed(3)
    mask = _mask([4, 2, 6, 1, 3, 5, 2, 2], 6)
    weight = torch.randn(8, 6, requires_grad=True)
    whole = TokenSum()(weight.square(), mask)
    torch.testing.assert_close(whole.double(), (weight.double().square() * mask.double()).sum(), rtol=1e-6, atol=0)
    (g_whole,) = torch.autograd.grad(whole, weight)
    total = TokenSum().denominator(mask)
    losses = [TokenSum()(weight[s].square(), mask[s], total) for s in (slice(0, 3), slice(3, 8))]
    (g_avg,) = torch.autograd.grad(sum(losses) / 2, weight)
    torch.testing.assert_close(g_avg, g_whole / 2)
