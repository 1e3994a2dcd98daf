"""Clip-Cov and KL-Cov (Cui et al. 2025) by hand, and against an independent re-derivation on random tensors."""

import math

import pytest
import torch

from components.surrogate import CovariancePG
from lightning_rl.core.batch import RolloutBatch

# one sample, 4 valid tokens: log pi = [-1, -2, -0.5, -0.5] (mean -1), A = [2, 0, -2, 4] (mean 1)
# Cov = [0 * 1, -1 * -1, 0.5 * -3, 0.5 * 3] = [0, 1, -1.5, 1.5]
LOGP = torch.tensor([[-1.0, -2.0, -0.5, -0.5]])
ADV = torch.tensor([[2.0, 0.0, -2.0, 4.0]])
LOG_RATIO = torch.tensor([[0.1, 0.1, 0.1, -0.2]])  # log pi_theta - log pi_old


def _batch():
    return RolloutBatch(
        response_ids=torch.zeros(1, 4, dtype=torch.long),
        response_mask=torch.ones(1, 4),
        old_logprobs=LOGP - LOG_RATIO,
        advantages=ADV,
    )


def _loss_and_grad(surrogate):
    logprobs = LOGP.clone().requires_grad_(True)
    loss, metrics = surrogate(logprobs, _batch())
    loss.sum().backward()
    return loss.detach(), logprobs.grad, metrics


def test_covariance_by_hand():
    cov = CovariancePG().covariance(LOGP, ADV, torch.ones(1, 4))
    torch.testing.assert_close(cov, torch.tensor([[0.0, 1.0, -1.5, 1.5]]))


def test_kl_cov_penalises_the_top_covariance_token():
    # ratio 0.25 of 4 tokens = 1 token: the largest Cov (1.5, token 3) gets beta |log r| = 0.2
    loss, grad, metrics = _loss_and_grad(CovariancePG("kl_cov", ratio=0.25, beta=1.0))
    r = [math.exp(0.1)] * 3 + [math.exp(-0.2)]
    torch.testing.assert_close(loss, torch.tensor([[-r[0] * 2, 0.0, r[2] * 2, -r[3] * 4 + 0.2]]))
    # d/dlogp: -r A, plus beta * sign(log r) on token 3
    torch.testing.assert_close(grad, torch.tensor([[-r[0] * 2, 0.0, r[2] * 2, -r[3] * 4 - 1.0]]))
    assert metrics["policy/cov_selected_frac"].item() == pytest.approx(0.25)


def test_clip_cov_detaches_the_tokens_in_the_band():
    # band [1, 5] holds tokens 1 (Cov 1) and 3 (Cov 1.5); ratio 1 draws both: their gradient is 0, values unchanged
    loss, grad, _ = _loss_and_grad(CovariancePG("clip_cov", ratio=1.0, cov_low=1.0, cov_high=5.0))
    r = [math.exp(0.1)] * 3 + [math.exp(-0.2)]
    torch.testing.assert_close(loss, torch.tensor([[-r[0] * 2, 0.0, r[2] * 2, -r[3] * 4]]))
    torch.testing.assert_close(grad, torch.tensor([[-r[0] * 2, 0.0, r[2] * 2, 0.0]]))


def test_clip_cov_detaches_ratio_x_n_tokens_drawn_at_random_from_the_band():
    # log pi = [-2, 0, -1, -1] (mean -1), A = [-1, 3, 1, 1] (mean 1): Cov = [2, 2, 0, 0], tokens 0 and 1 in the band
    # [1, 5], each with a nonzero advantage. ratio 0.25 of 4 tokens = 1 token: one of the two, drawn at random, loses
    # its gradient (value kept); the other and the tokens outside the band keep theirs
    logp, adv, log_ratio = (
        torch.tensor([[-2.0, 0.0, -1.0, -1.0]]),
        torch.tensor([[-1.0, 3.0, 1.0, 1.0]]),
        torch.tensor([[0.1, -0.1, 0.2, 0.0]]),
    )
    batch = RolloutBatch(
        response_ids=torch.zeros(1, 4, dtype=torch.long),
        response_mask=torch.ones(1, 4),
        old_logprobs=logp - log_ratio,
        advantages=adv,
    )
    full = -(log_ratio.exp() * adv)  # -r A: the loss, and its gradient d/dlogp, of every token left alone
    drawn = []
    for seed in range(12):
        torch.manual_seed(seed)
        logprobs = logp.clone().requires_grad_(True)
        loss, metrics = CovariancePG("clip_cov", ratio=0.25, cov_low=1.0, cov_high=5.0)(logprobs, batch)
        loss.sum().backward()
        torch.testing.assert_close(loss.detach(), full)
        detached = [t for t in range(4) if float(logprobs.grad[0, t]) == 0.0]
        assert len(detached) == 1 and detached[0] in (0, 1), detached
        kept = [t for t in range(4) if t not in detached]
        torch.testing.assert_close(logprobs.grad[0, kept], full[0, kept])
        assert metrics["policy/cov_selected_frac"].item() == pytest.approx(0.25)
        drawn.append(detached[0])
    assert set(drawn) == {0, 1}  # a random draw, not always the same token


def test_kl_cov_matches_an_independent_rederivation_on_random_tensors():
    torch.manual_seed(0)
    b, t = 4, 6
    mask = (torch.rand(b, t) > 0.2).float()
    logp, old, adv = -torch.rand(b, t) * 3, -torch.rand(b, t) * 3, torch.randn(b, t)
    batch = RolloutBatch(
        response_ids=torch.zeros(b, t, dtype=torch.long), response_mask=mask.long(), old_logprobs=old, advantages=adv
    )
    loss, _ = CovariancePG("kl_cov", ratio=0.2, beta=0.5)(logp, batch)
    # independent: list the valid tokens, compute Cov with python floats, take the top int(0.2 * N)
    cells = [(i, j) for i in range(b) for j in range(t) if mask[i, j] > 0]
    mean_lp = sum(float(logp[c]) for c in cells) / len(cells)
    mean_a = sum(float(adv[c]) for c in cells) / len(cells)
    cov = {c: (float(logp[c]) - mean_lp) * (float(adv[c]) - mean_a) for c in cells}
    top = set(sorted(cells, key=lambda c: -cov[c])[: max(1, int(0.2 * len(cells)))])
    for c in cells:
        lr = float(logp[c] - old[c])
        expected = -math.exp(lr) * float(adv[c]) + (0.5 * abs(lr) if c in top else 0.0)
        assert float(loss[c]) == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_kl_cov_penalty_is_logged_and_zero_on_policy():
    _, _, metrics = _loss_and_grad(CovariancePG("kl_cov", ratio=0.25, beta=1.0))
    assert metrics["policy/cov_penalty"].item() == pytest.approx(0.2 / 4)  # beta |log r| = 0.2 on 1 of 4 tokens
    on_policy = RolloutBatch(
        response_ids=torch.zeros(1, 4, dtype=torch.long),
        response_mask=torch.ones(1, 4),
        old_logprobs=LOGP,
        advantages=ADV,
    )
    logprobs = LOGP.clone().requires_grad_(True)
    loss, metrics = CovariancePG("kl_cov", ratio=0.25, beta=1.0)(logprobs, on_policy)
    loss.sum().backward()
    # ratio 1: the penalty and its gradient vanish (d|x|/dx at 0 is 0), leaving -A
    assert metrics["policy/cov_penalty"].item() == 0.0
    torch.testing.assert_close(logprobs.grad, -ADV)


def test_a_ratio_penalty_on_a_single_on_policy_update_warns():
    import warnings

    from lightning_rl.core.config import LoopConfig
    from lightning_rl.loop.module import RLModule

    with pytest.warns(UserWarning, match=r"KL-Cov penalty .* exactly 0.*model.loop.num_mini_batches"):
        RLModule(surrogate=CovariancePG("kl_cov"), loop=LoopConfig(ppo_epochs=1, num_mini_batches=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RLModule(
            surrogate=CovariancePG("kl_cov"), loop=LoopConfig(num_mini_batches=4)
        )  # off-policy after the first mini-batch
        RLModule(surrogate=CovariancePG("kl_cov"), loop=LoopConfig(ppo_epochs=2))
        RLModule(surrogate=CovariancePG("clip_cov"))  # detaching a token's gradient acts on-policy too
        RLModule(surrogate=CovariancePG("kl_cov", beta=0.0))
