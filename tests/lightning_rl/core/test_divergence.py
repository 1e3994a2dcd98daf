"""The reverse KL to a teacher from the policy's logits: the exact full-vocabulary one (its hand-written gradient against
autograd on the closed form) and the top-k one (k + 1 buckets), on hand-computed numbers and random logits."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_rl.core.divergence import exact_reverse_kl, topk_reverse_kl


def closed_form(z: torch.Tensor, t: torch.Tensor, temperature: float) -> torch.Tensor:
    """sum_v p_v (log p_v - log q_v), p = softmax(z / T), q = softmax(t), written out for autograd."""
    logp = torch.log_softmax(z.double() / temperature, dim=-1)
    logq = torch.log_softmax(t.double(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(-1)


def test_exact_reverse_kl_by_hand():
    # p = softmax([0, ln 3]) = [1/4, 3/4], q = [1/2, 1/2]:
    #   KL = 1/4 ln(1/2) + 3/4 ln(3/2) = -0.1732868 + 0.3040988 = 0.1308120
    #   dKL/dz_j = p_j (ln p_j - ln q_j - KL):  1/4 (ln 1/2 - 0.1308120) = -0.2059897,  3/4 (ln 3/2 - 0.1308120) = +0.2059897
    z = torch.tensor([[0.0, math.log(3.0)]], requires_grad=True)
    kl = exact_reverse_kl(z, torch.zeros(1, 2))
    assert kl.item() == pytest.approx(0.1308120, abs=1e-6)
    kl.sum().backward()
    torch.testing.assert_close(z.grad, torch.tensor([[-0.2059897, 0.2059897]]), rtol=0, atol=1e-6)


def test_exact_reverse_kl_value_and_gradient_equal_autograd_on_the_closed_form():
    torch.manual_seed(0)
    z = (torch.randn(3, 7, 50) * 2).requires_grad_(True)  # (B, R, V)
    teacher = torch.randn(3, 7, 50) * 2
    weights = torch.rand(3, 7)  # a weighted sum: a gradient that differs per position
    temperature = 0.7
    kl = exact_reverse_kl(z, teacher, temperature, chunk_rows=4)  # 21 rows in chunks of 4: the chunking is exercised
    (kl * weights).sum().backward()
    reference = z.detach().double().requires_grad_(True)
    expected = closed_form(reference, teacher, temperature)
    (expected * weights.double()).sum().backward()
    torch.testing.assert_close(kl.double(), expected.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(z.grad.double(), reference.grad, rtol=1e-5, atol=1e-6)  # fp32 against fp64


def test_exact_reverse_kl_refuses_two_vocabulary_widths():
    with pytest.raises(ValueError, match="top-k variant"):
        exact_reverse_kl(torch.zeros(2, 5), torch.zeros(2, 6))


def test_topk_reverse_kl_by_hand():
    # p = [0.5, 0.3, 0.2], q = [0.6, 0.3, 0.1], the teacher's top 1 = token 0: buckets {0}, {1, 2}
    #   p -> [0.5, 0.5], q -> [0.6, 0.4]:  KL = 0.5 ln(0.5 / 0.6) + 0.5 ln(0.5 / 0.4) = 0.0204110
    z = torch.tensor([[0.5, 0.3, 0.2]]).log()
    kl = topk_reverse_kl(z, torch.tensor([[0]]), torch.tensor([[0.6]]).log())
    assert kl.item() == pytest.approx(0.5 * math.log(0.5 / 0.6) + 0.5 * math.log(0.5 / 0.4), abs=1e-6)


def test_topk_reverse_kl_is_the_exact_one_at_full_width_and_below_it_otherwise():
    torch.manual_seed(1)
    z, teacher = torch.randn(4, 5, 30) * 2, torch.randn(4, 5, 30) * 2
    logq = torch.log_softmax(teacher, dim=-1)
    exact = exact_reverse_kl(z, teacher, 1.3)
    for k in (1, 5, 15, 30):
        values, ids = logq.topk(k, dim=-1)
        kl = topk_reverse_kl(z, ids, values, 1.3)
        if k == 30:
            torch.testing.assert_close(kl, exact, rtol=0, atol=1e-5)
        else:  # coarsening never increases a divergence
            assert bool((kl < exact).all()) and bool((kl >= 0).all())


def test_topk_reverse_kl_gradient_through_its_checkpointed_chunks():
    torch.manual_seed(2)
    z = torch.randn(6, 40, requires_grad=True)
    values, ids = torch.log_softmax(torch.randn(6, 40), dim=-1).topk(8, dim=-1)
    topk_reverse_kl(z, ids, values, 0.9, chunk_rows=4).sum().backward()
    chunked = z.grad.clone()
    z.grad = None
    topk_reverse_kl(z, ids, values, 0.9, chunk_rows=64).sum().backward()  # one chunk
    torch.testing.assert_close(chunked, z.grad, rtol=0, atol=1e-6)
    # at full width its gradient is the exact KL's
    z.grad = None
    teacher = torch.randn(6, 40)
    values, ids = torch.log_softmax(teacher, dim=-1).topk(40, dim=-1)
    topk_reverse_kl(z, ids, values, 0.9).sum().backward()
    full = z.grad.clone()
    z.grad = None
    exact_reverse_kl(z, teacher, 0.9).sum().backward()
    torch.testing.assert_close(full, z.grad, rtol=0, atol=1e-5)


def _topk_kl_fp64(z: torch.Tensor, teacher: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The k + 1-bucket KL re-derived in fp64 from the teacher's full logits (its rest bucket 1 - sum of its top k,
    floored as the module documents), for autograd."""
    from lightning_rl.core.divergence import REST_FLOOR

    logp, logq = torch.log_softmax(z, dim=-1), torch.log_softmax(teacher.double(), dim=-1)
    top_p, top_q = logp.gather(-1, ids), logq.gather(-1, ids)
    logp_rest = torch.logsumexp(logp.scatter(-1, ids, -torch.inf), dim=-1)
    logq_rest = torch.logsumexp(logq.scatter(-1, ids, -torch.inf), dim=-1).clamp_min(math.log(REST_FLOOR))
    return (top_p.exp() * (top_p - top_q)).sum(-1) + logp_rest.exp() * (logp_rest - logq_rest)


def _confident_rows(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """#46 item 1's case: 64 rows over 1000 tokens, the teacher sure of token 0 (logit + 25: its top-20 mass is 1 - ~4e-8,
    1 in float32), the student less so (+ 12)."""
    generator = torch.Generator().manual_seed(seed)
    student, teacher = torch.randn(64, 1000, generator=generator), torch.randn(64, 1000, generator=generator)
    student[:, 0] += 12
    teacher[:, 0] += 25
    return student, teacher


def test_topk_reverse_kl_of_a_confident_teacher_equals_the_fp64_k_plus_1_bucket_kl_values_and_gradients():
    """#46 item 1: the rest bucket was log((1 - exp(logsumexp(top k))).clamp_min(float32 tiny)) = -87.3 where the top-k
    mass rounds to 1 in float32: the value was 1.30 where the exact KL is 0.25. Teacher log-probs exact to float32
    (log-softmax in fp64, then rounded): the value and its gradient are the fp64 k + 1-bucket ones."""
    student, teacher = _confident_rows()
    values, ids = torch.log_softmax(teacher.double(), dim=-1).float().topk(20, dim=-1)
    z = student.clone().requires_grad_(True)
    weights = torch.rand(64, generator=torch.Generator().manual_seed(1))
    kl = topk_reverse_kl(z, ids, values, chunk_rows=16)
    (kl * weights).sum().backward()
    reference = student.double().requires_grad_(True)
    expected = _topk_kl_fp64(reference, teacher, ids)
    (expected * weights.double()).sum().backward()
    torch.testing.assert_close(kl.double(), expected.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(z.grad.double(), reference.grad, rtol=0, atol=1e-5)
    assert 0.2 < kl.mean().item() < closed_form(student, teacher, 1.0).mean().item()


def test_topk_reverse_kl_from_float32_log_softmax_never_exceeds_the_exact_kl():
    """The issue's repro as a teacher in float32 gives it: the top log-prob is exactly 0.0 (or a few ulps off it), so
    the rest's mass is below the rounding; the value stays under the exact KL at every position."""
    student, teacher = _confident_rows()
    values, ids = torch.log_softmax(teacher, dim=-1).topk(20, dim=-1)
    assert bool((values[:, 0] == 0).any())
    kl, exact = topk_reverse_kl(student, ids, values), closed_form(student, teacher, 1.0)
    assert bool((kl.double() <= exact).all()) and bool((kl >= 0).all())
    # where the teacher's rest is lighter than the floor, both are the floored fp64 value; above it, float32 rounding
    # of the top log-prob (its ulp is ~6e-8, the size of the rest) decides
    from lightning_rl.core.divergence import REST_FLOOR

    light = torch.log_softmax(teacher.double(), dim=-1).exp().scatter(-1, ids, 0.0).sum(-1) < REST_FLOOR
    assert int(light.sum()) > 32
    expected = _topk_kl_fp64(student.double(), teacher, ids)
    torch.testing.assert_close(kl.double()[light], expected[light], rtol=0, atol=1e-5)


def test_the_teachers_rest_bucket_by_hand():
    from lightning_rl.core.divergence import REST_FLOOR, teacher_rest_logprob

    # 1 - (0.5 + 0.3) = 0.2; 1 - (1 - 1e-9) = 1e-9 (below the floor); 1 - (1 - 1e-4 + 4e-5 + 2e-5) = 4e-5
    x = torch.tensor([[math.log(0.5), math.log(0.3), -math.inf]])
    assert teacher_rest_logprob(x).item() == pytest.approx(math.log(0.2), abs=1e-7)
    assert teacher_rest_logprob(torch.tensor([[-1e-9, -30.0]])).item() == pytest.approx(math.log(REST_FLOOR))
    assert teacher_rest_logprob(torch.tensor([[0.0]])).item() == pytest.approx(math.log(REST_FLOOR))  # a server's 0.0
    x = torch.tensor([[math.log1p(-1e-4), math.log(4e-5), math.log(2e-5)]])
    assert teacher_rest_logprob(x).item() == pytest.approx(math.log(4e-5), rel=1e-5)
