"""`reverse_scan`: the chunked y_t = x_t + decay_t y_{t+1} behind GAE and the discounted reward-to-go."""

from __future__ import annotations

import pytest
import torch

from lightning_rl.core.ops import reverse_scan


def _loop(x: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """The sequential recurrence, in float64."""
    x, decay = torch.broadcast_tensors(x.double(), decay.double())
    out, running = torch.zeros_like(x), torch.zeros_like(x[..., 0])
    for t in reversed(range(x.shape[-1])):
        running = x[..., t] + decay[..., t] * running
        out[..., t] = running
    return out


def test_hand_computed():
    # y_2 = 3; y_1 = 2 + 0.5 * 3 = 3.5; y_0 = 1 + 0.1 * 3.5 = 1.35
    x, decay = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.1, 0.5, 0.9])
    torch.testing.assert_close(reverse_scan(x, decay, chunk=2), torch.tensor([1.35, 3.5, 3.0]), rtol=0, atol=1e-7)


@pytest.mark.parametrize("t_len, chunk", [(1, 64), (7, 3), (64, 64), (65, 64), (300, 16), (1000, 64)])
def test_matches_the_sequential_loop_on_random_decays_with_holes(t_len, chunk):
    g = torch.Generator().manual_seed(t_len)
    x = torch.randn(2, 5, t_len, generator=g)
    decay = torch.rand(2, 5, t_len, generator=g) * (torch.rand(2, 5, t_len, generator=g) > 0.1)  # zeros = holes
    torch.testing.assert_close(reverse_scan(x, decay, chunk=chunk).double(), _loop(x, decay), rtol=1e-5, atol=1e-5)


def test_broadcasts_one_input_over_several_decay_rows():
    x = torch.randn(4, 50)
    decay = torch.stack([torch.full((4, 50), 0.95), torch.ones(4, 50)])  # (K=2, B, T), as GAE's two lambdas
    out = reverse_scan(x, decay, chunk=8)
    assert out.shape == (2, 4, 50)
    torch.testing.assert_close(out[1].double(), x.double().flip(-1).cumsum(-1).flip(-1), rtol=1e-5, atol=1e-5)


def test_trailing_padding_changes_no_bit():
    x, decay = torch.randn(3, 130), torch.rand(3, 130)
    decay[:, 99] = 0.0  # the last valid token: nothing flows back from the padding
    padded_x = torch.cat([x[:, :100], torch.zeros(3, 30)], -1)
    assert torch.equal(reverse_scan(padded_x, decay)[:, :100], reverse_scan(x[:, :100], decay[:, :100]))


def test_chunk_size_only_regroups_rounding():
    x, decay = torch.randn(6, 777), torch.rand(6, 777)
    torch.testing.assert_close(reverse_scan(x, decay, chunk=5), reverse_scan(x, decay, chunk=200), rtol=1e-5, atol=1e-5)


def test_within_one_chunk_the_arithmetic_is_the_fp32_loops_bit_for_bit():
    x, decay = torch.randn(3, 40), torch.rand(3, 40)
    out, running = torch.zeros_like(x), torch.zeros_like(x[:, 0])
    for t in reversed(range(40)):
        running = x[:, t] + decay[:, t] * running
        out[:, t] = running
    assert torch.equal(reverse_scan(x, decay, chunk=64), out)


def test_empty_time_or_batch_axes():
    assert reverse_scan(torch.zeros(3, 0), torch.zeros(3, 0)).shape == (3, 0)
    assert reverse_scan(torch.zeros(0, 5), torch.zeros(0, 5)).shape == (0, 5)
