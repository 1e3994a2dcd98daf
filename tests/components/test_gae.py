import pytest
import torch

from components.advantage import GAE
from lightning_rl.core.batch import RolloutBatch, terminal_rewards
from lightning_rl.loop.requirements import check_requirements

VALUES = [0.5, 0.6, 0.7, 0.8]


def _batch(scores, values, lengths, width=None, **fields) -> RolloutBatch:
    scores = torch.as_tensor(scores, dtype=torch.float32)
    lengths = torch.as_tensor(lengths)
    width = width or int(lengths.max())
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    values = torch.as_tensor(values, dtype=torch.float32)
    values = torch.nn.functional.pad(values, (0, width - values.shape[1])) * mask
    return RolloutBatch(
        response_ids=torch.ones_like(mask),
        response_mask=mask,
        scores=scores,
        values=values,
        token_rewards=terminal_rewards(scores, mask),
        sample_mask=torch.ones(len(scores)),
        **fields,
    )


def _loop_gae(rewards, values, length, gamma, lam):
    """Scalar per-step recurrence on one sequence (seeds ch. 6.10 `gae`): values[T] = 0 at EOS."""
    v = [float(x) for x in values[:length]] + [0.0]
    adv, last = [0.0] * length, 0.0
    for t in reversed(range(length)):
        delta = float(rewards[t]) + gamma * v[t + 1] - v[t]
        last = delta + gamma * lam * last
        adv[t] = last
    return adv


@pytest.mark.parametrize(
    "lam, expected",
    [
        # terminal reward 1, V = [0.5, 0.6, 0.7, 0.8], gamma 1 (issue 4's hand-computed numbers)
        (1.0, [0.5, 0.4, 0.3, 0.2]),  # Monte-Carlo: 1 - V_t
        (0.0, [0.1, 0.1, 0.1, 0.2]),  # TD(0): V_{t+1} - V_t, and 1 - 0.8 at the end
        (0.95, [0.456725, 0.3755, 0.29, 0.2]),  # 0.2; 0.1 + 0.95 * 0.2; 0.1 + 0.95 * 0.29; 0.1 + 0.95 * 0.3755
    ],
)
def test_hand_computed_numbers(lam, expected):
    advantages, returns = GAE(gamma=1.0, lam_actor=lam)(_batch([1.0], [VALUES], [4]))
    torch.testing.assert_close(advantages[0], torch.tensor(expected), atol=1e-6, rtol=0)
    # classic PPO: one lambda, targets = A + V
    torch.testing.assert_close(returns[0], torch.tensor(expected) + torch.tensor(VALUES), atol=1e-6, rtol=0)


def test_gamma_discounts_the_terminal_reward():
    # gamma 0.5, lambda 1: A_t = 0.5^(3 - t) * 1 - V_t
    advantages, _ = GAE(gamma=0.5, lam_actor=1.0)(_batch([1.0], [VALUES], [4]))
    torch.testing.assert_close(
        advantages[0], torch.tensor([0.125 - 0.5, 0.25 - 0.6, 0.5 - 0.7, 1.0 - 0.8]), atol=1e-6, rtol=0
    )


def test_padding_after_the_last_valid_token_changes_nothing():
    estimator = GAE(gamma=1.0, lam_actor=0.95, lam_critic=1.0)
    short = _batch([1.0], [VALUES], [4])
    padded = _batch([1.0], [VALUES], [4], width=9)
    # garbage in the padding: values and rewards there must be ignored, not bootstrapped from
    padded.values[0, 4:] = torch.tensor([5.0, -3.0, 2.0, 7.0, 1.0])
    padded.token_rewards[0, 4:] = torch.tensor([9.0, 9.0, -9.0, 1.0, 4.0])
    adv_short, ret_short = estimator(short)
    adv_padded, ret_padded = estimator(padded)
    assert torch.equal(adv_padded[:, :4], adv_short) and torch.equal(ret_padded[:, :4], ret_short)
    assert torch.equal(adv_padded[:, 4:], torch.zeros(1, 5)) and torch.equal(ret_padded[:, 4:], torch.zeros(1, 5))


def test_the_seed_loop_leaks_padding_but_gae_does_not():
    # ch. 6.9's compute_gae masks the bootstrap with the current token's mask: a nonzero value at the
    # first padding position reaches the last valid token. Documented here so a regression is visible.
    values = torch.tensor([[0.5, 0.6, 0.7, 0.8, 3.0]])
    mask = torch.tensor([[1.0, 1, 1, 1, 0]])
    rewards = torch.tensor([[0.0, 0, 0, 1, 0]])
    seed_last = rewards[0, 3] + 1.0 * values[0, 4] * mask[0, 3] - values[0, 3]  # the seed's delta at t = 3
    assert float(seed_last) == pytest.approx(3.2)
    batch = RolloutBatch(
        response_ids=torch.ones(1, 5, dtype=torch.long), response_mask=mask.long(), values=values, token_rewards=rewards
    )
    assert float(GAE(lam_actor=0.0)(batch).advantages[0, 3]) == pytest.approx(0.2, abs=1e-7)


@pytest.mark.parametrize("lam_actor", [0.0, 0.5, 0.95, "adaptive"])
def test_lam_critic_one_gives_monte_carlo_returns_whatever_lam_actor(lam_actor):
    torch.manual_seed(0)
    lengths = [5, 1, 3, 7]
    batch = _batch([0.7, -1.0, 2.0, 0.3], torch.randn(4, 7), lengths)
    batch.token_rewards += torch.randn(4, 7) * 0.1 * batch.response_mask  # a KL-in-reward term on every token
    _, returns = GAE(gamma=1.0, lam_actor=lam_actor, lam_critic=1.0)(batch)
    # reward-to-go: sum_{t' >= t} r_t'
    mc = (
        torch.flip(torch.cumsum(torch.flip(batch.token_rewards * batch.response_mask, [1]), 1), [1])
        * batch.response_mask
    )
    torch.testing.assert_close(returns, mc, atol=1e-6, rtol=0)


def test_vapo_adaptive_lambda_seed_numbers():
    estimator = GAE(lam_actor="adaptive", alpha=0.05)
    lam = estimator.actor_lambda(torch.tensor([100, 1000, 20, 10, 0]))
    # 1 - 1/(0.05 * 100) = 0.8; 1 - 1/50 = 0.98; l = 20 -> 0; shorter -> clamped to 0, never negative
    torch.testing.assert_close(lam, torch.tensor([0.8, 0.98, 0.0, 0.0, 0.0]), atol=1e-6, rtol=0)


def test_adaptive_lambda_is_per_sequence():
    # two sequences of lengths 40 (lambda 0.5) and 4 (lambda 0): each must match a fixed-lambda run of its own
    torch.manual_seed(1)
    batch = _batch([1.0, 1.0], torch.rand(2, 40), [40, 4])
    adaptive, _ = GAE(lam_actor="adaptive", alpha=0.05)(batch)
    half, _ = GAE(lam_actor=0.5)(batch.select(slice(0, 1)))
    zero, _ = GAE(lam_actor=0.0)(batch.select(slice(1, 2)))
    torch.testing.assert_close(adaptive[0], half[0], atol=0, rtol=0)
    torch.testing.assert_close(adaptive[1], zero[0], atol=0, rtol=0)


@pytest.mark.parametrize("gamma, lam_actor, lam_critic", [(1.0, 0.95, None), (0.9, 0.7, 1.0), (1.0, "adaptive", 0.9)])
def test_random_rederivation_matches_the_per_step_loop(gamma, lam_actor, lam_critic):
    torch.manual_seed(2)
    b, width = 6, 30
    lengths = torch.tensor([30, 1, 17, 25, 8, 29])
    batch = _batch(torch.randn(b), torch.randn(b, width), lengths)
    batch.token_rewards += torch.randn(b, width) * batch.response_mask
    estimator = GAE(gamma=gamma, lam_actor=lam_actor, lam_critic=lam_critic, alpha=0.1)
    advantages, returns = estimator(batch)
    lam = estimator.actor_lambda(lengths)
    for i in range(b):
        n = int(lengths[i])
        lc = float(lam[i]) if lam_critic is None else lam_critic
        adv = torch.tensor(_loop_gae(batch.token_rewards[i], batch.values[i], n, gamma, float(lam[i])))
        ret = torch.tensor(_loop_gae(batch.token_rewards[i], batch.values[i], n, gamma, lc)) + batch.values[i, :n]
        torch.testing.assert_close(advantages[i, :n], adv, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(returns[i, :n], ret, atol=1e-5, rtol=1e-5)
        assert torch.equal(advantages[i, n:], torch.zeros(width - n))


def test_fp32_recurrence_is_exact_against_an_fp32_step_loop():
    # same operations in the same order per element: bit-identical, not merely close
    torch.manual_seed(3)
    lengths = torch.tensor([12, 5, 9])
    batch = _batch(torch.randn(3), torch.randn(3, 12), lengths)
    advantages, _ = GAE(gamma=0.99, lam_actor=0.9)(batch)
    for i in range(3):
        n, r, v = int(lengths[i]), batch.token_rewards[i].float(), batch.values[i].float()
        last = torch.zeros((), dtype=torch.float32)
        for t in reversed(range(n)):
            next_v = v[t + 1] if t + 1 < n else torch.zeros(())
            delta = r[t] + 0.99 * next_v - v[t]
            last = delta + (0.99 * torch.tensor(0.9) * (1.0 if t + 1 < n else 0.0)) * last
            assert torch.equal(advantages[i, t], last), (i, t)


def test_bf16_inputs_are_computed_in_fp32():
    batch = _batch([1.0], [VALUES], [4])
    low = batch.replace(values=batch.values.bfloat16(), token_rewards=batch.token_rewards.bfloat16())
    advantages, returns = GAE(lam_actor=0.95)(low)
    assert advantages.dtype == torch.float32 and returns.dtype == torch.float32


def test_returns_are_taken_before_whitening():
    batch = _batch([1.0, 0.0, 0.5], torch.rand(3, 4), [4, 2, 3])
    raw_adv, raw_ret = GAE(lam_actor=0.95)(batch)
    white_adv, white_ret = GAE(lam_actor=0.95, whiten="batch")(batch)
    assert torch.equal(raw_ret, white_ret)
    mask = batch.response_mask.bool()
    assert float(white_adv[mask].mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(white_adv[mask].std(correction=0)) == pytest.approx(1.0, abs=1e-4)
    assert not torch.allclose(raw_adv, white_adv)


def test_every_option_changes_the_output():
    torch.manual_seed(4)
    batch = _batch([1.0, 0.0, 0.5], torch.rand(3, 30), [30, 25, 12])
    batch.token_rewards += 0.1 * torch.randn(3, 30) * batch.response_mask
    base = GAE()(batch)
    variants = {
        "gamma": GAE(gamma=0.9),
        "lam_actor": GAE(lam_actor=0.5),
        "adaptive": GAE(lam_actor="adaptive"),
        "alpha": GAE(lam_actor="adaptive", alpha=0.5),
        "whiten": GAE(whiten="batch"),
        "shift_mean": GAE(whiten="batch", shift_mean=False),
    }
    for name, estimator in variants.items():
        assert not torch.allclose(estimator(batch).advantages, base.advantages), name
    assert torch.allclose(GAE(lam_critic=0.3)(batch).advantages, base.advantages)  # lam_critic moves only the returns
    assert not torch.allclose(GAE(lam_critic=0.3)(batch).returns, base.returns)
    assert not torch.allclose(
        GAE(lam_actor="adaptive", alpha=0.5)(batch).advantages, GAE(lam_actor="adaptive")(batch).advantages
    )


def test_bad_arguments_name_the_culprit():
    with pytest.raises(ValueError, match="lam_actor"):
        GAE(lam_actor=1.5)
    with pytest.raises(ValueError, match="lam_actor"):
        GAE(lam_actor="fixed")
    with pytest.raises(ValueError, match="lam_critic"):
        GAE(lam_critic=-0.1)
    with pytest.raises(ValueError, match="gamma"):
        GAE(gamma=1.2)
    with pytest.raises(ValueError, match="alpha"):
        GAE(alpha=0.0)


def test_missing_values_fail_with_the_fix():
    batch = _batch([1.0], [VALUES], [4]).replace(values=None)
    with pytest.raises(ValueError, match="values"):
        GAE()(batch)

    class _Module:  # what check_requirements reads from RLModule
        advantage, reward, sampling, surrogate, critic, kl, loss_terms, teacher = (
            GAE(),
            None,
            None,
            None,
            None,
            None,
            [],
            None,
        )

        class rollout:
            provides = frozenset({"prompt_ids", "prompt_mask", "response_ids", "response_mask"})
            top_p, top_k = 1.0, 0

    with pytest.raises(ValueError, match="add a critic"):
        check_requirements(_Module())


def test_misshapen_values_are_refused():
    batch = _batch([1.0], [VALUES], [4])
    with pytest.raises(ValueError, match=r"values has shape \(1, 3\), expected \(B, R\) = \(1, 4\)"):
        GAE()(batch.replace(values=batch.values[:, :3]))


def _transcript_batch(obs_values: float) -> RolloutBatch:
    """Two turns: the model's tokens 0-1, an observation at 2-3, the model's tokens 4-5, padding at 6.
    The environment rewards turn 1 with 0.25 (on its last token); the final score is 1."""
    response_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])
    action_mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0]])
    values = torch.tensor([[0.5, 0.6, obs_values, obs_values, 0.7, 0.8, 0.0]])
    env_rewards = torch.tensor([[0.0, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0]])
    batch = RolloutBatch(
        response_ids=torch.ones_like(response_mask),
        response_mask=response_mask,
        action_mask=action_mask,
        values=values,
        scores=torch.tensor([1.0]),
    )
    return batch.replace(token_rewards=terminal_rewards(batch.scores, batch.action_tokens) + env_rewards)


def test_observations_are_not_steps():
    # over the model's tokens r = [0, 0.25, 0, 1], V = [0.5, 0.6, 0.7, 0.8], gamma 1, lambda 0.95:
    # A3 = 1 - 0.8 = 0.2; A2 = 0.1 + 0.95 * 0.2 = 0.29; delta1 = 0.25 + 0.7 - 0.6 = 0.35 (V after the tool
    # result bootstraps the turn's last token), A1 = 0.35 + 0.95 * 0.29 = 0.6255; A0 = 0.1 + 0.95 * 0.6255 = 0.694225
    expected = torch.tensor([0.694225, 0.6255, 0.0, 0.0, 0.29, 0.2, 0.0])
    values = torch.tensor([0.5, 0.6, 0.0, 0.0, 0.7, 0.8, 0.0])
    for obs_values in (0.0, 9.0):  # a critic's values at observation tokens change nothing
        advantages, returns = GAE(gamma=1.0, lam_actor=0.95)(_transcript_batch(obs_values))
        torch.testing.assert_close(advantages[0], expected, atol=1e-6, rtol=0)
        torch.testing.assert_close(
            returns[0], (expected + values) * torch.tensor([1, 1, 0, 0, 1, 1, 0.0]), atol=1e-6, rtol=0
        )


def test_discount_counts_the_models_tokens_only():
    # gamma 0.5, lambda 1: A_t = G_t - V_t with G over 4 steps: G3 = 1, G2 = 0.5, G1 = 0.25 + 0.5 * 0.5 = 0.5, G0 = 0.25
    advantages, _ = GAE(gamma=0.5, lam_actor=1.0)(_transcript_batch(3.0))
    torch.testing.assert_close(
        advantages[0], torch.tensor([0.25 - 0.5, 0.5 - 0.6, 0, 0, 0.5 - 0.7, 1.0 - 0.8, 0]), atol=1e-6, rtol=0
    )


def test_vapo_length_is_the_models_token_count():
    # adaptive lambda with alpha 0.5 and 4 model tokens: 1 - 1 / (0.5 * 4) = 0.5 (7 response tokens would give 5/7)
    advantages, _ = GAE(gamma=1.0, lam_actor="adaptive", alpha=0.5, lam_critic=1.0)(_transcript_batch(0.0))
    # A3 = 0.2; A2 = 0.1 + 0.5 * 0.2 = 0.2; A1 = 0.35 + 0.5 * 0.2 = 0.45; A0 = 0.1 + 0.5 * 0.45 = 0.325
    torch.testing.assert_close(advantages[0], torch.tensor([0.325, 0.45, 0, 0, 0.2, 0.2, 0]), atol=1e-6, rtol=0)
