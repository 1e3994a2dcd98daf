"""Environment tokens in a multi-turn transcript (``action_mask`` 0) are context, never trained on: the gradient
at the logits that score them is exactly zero for every surrogate, KL placement, loss term and aggregator, and
every estimator leaves them without advantage."""

import pytest
import torch

from components.advantage import GAE, GroupNormalized, LeaveOneOut, ReinforceBaseline, ReinforcePlusPlus
from components.aggregator import SeqMeanTokenMean, SeqMeanTokenSum, TokenMean, TokenSumNorm
from components.kl import KLRegularizer
from components.loss_terms import EntropyBonus, PositiveNLL
from components.surrogate import CISPO, ClippedSurrogate, CovariancePG, OffPolicyCorrection, PolicyGradient
from lightning_rl.core.batch import RolloutBatch, terminal_rewards
from lightning_rl.core.forward_outputs import PolicyForward

B, R, V = 4, 7, 11
RESPONSE_MASK = torch.tensor(
    [[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0]]
)
ACTION_MASK = torch.tensor([[1, 1, 0, 0, 1, 1, 1], [1, 0, 0, 1, 1, 0, 1], [1, 1, 1, 1, 1, 1, 1], [1, 0, 1, 1, 0, 1, 1]])
ENV = (RESPONSE_MASK * (1 - ACTION_MASK)).bool()  # (B, R) the environment's tokens
ACTIONS = (RESPONSE_MASK * ACTION_MASK).bool()

SURROGATES = {
    "clipped": ClippedSurrogate(0.2, 0.28),
    "clipped_dual": ClippedSurrogate(0.2, 0.2, dual_clip=3.0),
    "gspo": ClippedSurrogate(3e-4, 4e-4, level="sequence"),
    "cispo": CISPO(eps_high=0.28),
    "pg": PolicyGradient(),
    "clip_cov": CovariancePG("clip_cov", ratio=0.25, cov_low=-10.0, cov_high=10.0),
    "kl_cov": CovariancePG("kl_cov", ratio=0.5),
    "tis": ClippedSurrogate(correction=OffPolicyCorrection("tis", cap=1.5)),
    "mis_sequence": PolicyGradient(correction=OffPolicyCorrection("mis", cap=50.0, lower=0.0, level="sequence")),
}
KLS = {f"{e}_loss": KLRegularizer(0.1, e, "loss") for e in ("k1", "k2", "k3")} | {
    "k3_weighted": KLRegularizer(0.1, "k3", "loss", importance_weighted=True)
}
TERMS = {"entropy": EntropyBonus(0.01), "positive_nll": PositiveNLL(0.1)}
AGGREGATORS = [TokenMean(), SeqMeanTokenMean(), SeqMeanTokenSum(), TokenSumNorm(16.0)]


def _logits() -> torch.Tensor:
    return torch.randn(B, R, V, generator=torch.Generator().manual_seed(1))  # (B, R, V)


def _batch(seed: int = 0) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, R), generator=g)
    logprobs = torch.log_softmax(_logits(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)  # (B, R)

    def near() -> torch.Tensor:  # a policy a little away from the current one (some ratios clip, most do not)
        return logprobs + 0.1 * torch.randn(B, R, generator=g)

    # advantages and old / reference / sampler log-probs are nonzero everywhere, environment tokens included:
    # only the mask may keep them out of the loss
    return RolloutBatch(
        response_ids=ids,
        response_mask=RESPONSE_MASK,
        action_mask=ACTION_MASK,
        advantages=torch.randn(B, R, generator=g),
        old_logprobs=near(),
        ref_logprobs=near(),
        rollout_logprobs=near(),
        scores=torch.tensor([1.0, 0.0, 1.0, 0.0]),
        sample_mask=torch.ones(B),
        group_ids=torch.tensor([0, 0, 1, 1]),
    )


def _logit_grad(batch: RolloutBatch, surrogate=None, kl=None, term=None, aggregator=TokenMean()) -> torch.Tensor:
    logits = _logits().requires_grad_(True)
    logp = torch.log_softmax(logits, -1)
    logprobs = logp.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)  # (B, R)
    entropy = -(logp.exp() * logp).sum(-1)  # (B, R)
    per_token = torch.zeros(B, R)
    if surrogate is not None:
        per_token = per_token + surrogate(logprobs, batch)[0]
    if kl is not None:
        per_token = per_token + kl.loss_term(logprobs, batch)
    if term is not None:
        per_token = per_token + term(PolicyForward(logprobs, entropy), batch)
    aggregator(per_token, batch.loss_mask).backward()
    return logits.grad  # (B, R, V)


def _check(grad: torch.Tensor) -> None:
    assert torch.equal(grad[ENV], torch.zeros_like(grad[ENV]))  # exactly zero
    assert grad[ACTIONS].abs().sum(-1).gt(0).float().mean() > 0.5  # and the model's tokens do learn


@pytest.mark.parametrize("name", SURROGATES)
@pytest.mark.parametrize("aggregator", AGGREGATORS, ids=lambda a: type(a).__name__)
def test_surrogates(name, aggregator):
    torch.manual_seed(0)  # clip_cov's random draw
    _check(_logit_grad(_batch(), surrogate=SURROGATES[name], aggregator=aggregator))


@pytest.mark.parametrize("name", KLS)
def test_kl_in_the_loss(name):
    _check(_logit_grad(_batch(), kl=KLS[name]))


@pytest.mark.parametrize("name", TERMS)
def test_loss_terms(name):
    _check(_logit_grad(_batch().replace(scores=torch.ones(B)), term=TERMS[name]))  # every sample positive (PositiveNLL)


def test_kl_in_the_reward_and_the_terminal_reward_skip_environment_tokens():
    batch = _batch()
    penalty = KLRegularizer(0.1, "k1", "reward").reward_penalty(batch)
    assert torch.equal(penalty[ENV], torch.zeros(int(ENV.sum())))
    assert bool((penalty[ACTIONS] != 0).all())
    rewards = terminal_rewards(batch.scores, batch.action_tokens)
    # row 0: the last response token (5) is the model's; row 1: ditto (6); row 3: token 4 is an observation -> 3
    assert rewards.nonzero().tolist() == [[0, 5], [2, 2]]  # rows 1 and 3 score 0


@pytest.mark.parametrize(
    "estimator",
    [
        GroupNormalized(),
        LeaveOneOut(),
        ReinforceBaseline(),
        ReinforcePlusPlus(gamma=0.9),
        GAE(gamma=0.9, lam_actor=0.9),
    ],
    ids=lambda e: type(e).__name__,
)
def test_estimators_leave_environment_tokens_without_advantage(estimator):
    batch = _batch()
    batch = batch.replace(
        token_rewards=terminal_rewards(batch.scores, batch.action_tokens), values=torch.rand(B, R) * RESPONSE_MASK
    )
    advantages, returns = estimator(batch)
    assert torch.equal(advantages[ENV], torch.zeros(int(ENV.sum())))
    assert bool((advantages[ACTIONS] != 0).any())
    if returns is not None:
        assert torch.equal(returns[ENV], torch.zeros(int(ENV.sum())))


def test_reinforce_pp_discounts_over_the_models_tokens():
    # one row, tokens: model, observation, observation, model; score 1, gamma 0.5 -> G = [0.5, 0, 0, 1]
    batch = RolloutBatch(
        response_ids=torch.ones(1, 4, dtype=torch.long),
        response_mask=torch.ones(1, 4),
        action_mask=torch.tensor([[1, 0, 0, 1]]),
    )
    batch = batch.replace(token_rewards=terminal_rewards(torch.tensor([1.0]), batch.action_tokens))
    advantages, _ = ReinforcePlusPlus(gamma=0.5, whiten="none")(batch)
    assert advantages.tolist() == [[0.5, 0.0, 0.0, 1.0]]


def _wild(batch: RolloutBatch) -> RolloutBatch:
    """``batch`` with far-off values at the environment's tokens only: old and sampler log-probs 5 nats away (any
    ratio there would clip), advantages, values and returns 100x larger. Nothing computed over the model's tokens may change."""
    g = torch.Generator().manual_seed(5)

    def at_env(scale: float) -> torch.Tensor:
        return torch.where(ENV, scale * torch.randn(B, R, generator=g), torch.zeros(B, R))

    return batch.replace(
        old_logprobs=batch.old_logprobs + at_env(5.0),
        rollout_logprobs=batch.rollout_logprobs + at_env(5.0),
        advantages=batch.advantages + at_env(100.0),
        values=batch.values + at_env(100.0),
        returns=batch.returns + at_env(100.0),
    )


def _with_values(batch: RolloutBatch) -> RolloutBatch:
    g = torch.Generator().manual_seed(3)
    return batch.replace(values=torch.randn(B, R, generator=g), returns=torch.randn(B, R, generator=g))


@pytest.mark.parametrize("name", SURROGATES)
def test_surrogate_loss_and_metrics_ignore_environment_tokens(name):
    # clip fractions, approx-KL, ratio statistics, covariance selection and the aggregated loss are taken over
    # the model's tokens only: whatever sits at the environment's tokens changes none of them (bit for bit)
    batch = _with_values(_batch())
    logprobs = torch.log_softmax(_logits(), -1).gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
    results = []
    for b in (batch, _wild(batch)):
        torch.manual_seed(0)  # clip_cov's random draw
        loss, metrics = SURROGATES[name](logprobs, b)
        results.append((TokenMean()(loss, b.loss_mask), metrics))
    (loss, metrics), (wild_loss, wild_metrics) = results
    assert torch.equal(loss, wild_loss)
    assert metrics.keys() == wild_metrics.keys() and all(torch.equal(metrics[k], wild_metrics[k]) for k in metrics), (
        name
    )
    if name == "clipped":  # the check can fail: over every response token, the wild ratios would clip
        everywhere = SURROGATES[name](logprobs, _wild(batch).replace(action_mask=None))[1]
        assert (
            everywhere["policy/clipfrac_low"] + everywhere["policy/clipfrac_high"]
            > metrics["policy/clipfrac_low"] + metrics["policy/clipfrac_high"]
        )


@pytest.mark.parametrize("value_clip", [None, 0.2])
def test_value_loss_has_no_gradient_at_environment_tokens(value_clip):
    from components.critic import ValueCritic

    critic = ValueCritic(value_clip=value_clip)
    batch = _with_values(_batch())
    results = []
    for b in (batch, _wild(batch)):
        values = (b.values + 0.3 * torch.randn(B, R, generator=torch.Generator().manual_seed(2))).requires_grad_(True)
        loss, metrics = critic.loss(values, b)
        SeqMeanTokenMean()(loss, b.loss_mask).backward()
        assert torch.equal(values.grad[ENV], torch.zeros(int(ENV.sum())))
        assert (values.grad[ACTIONS] != 0).float().mean() > 0.5  # clipped values have none
        results.append(metrics)
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])


def test_the_module_places_the_score_the_environments_rewards_and_the_kl_penalty():
    # RLModule's estimate phase on one transcript: model tokens 0-1 (turn 1), observation 2-3, model tokens 4-5
    # (turn 2), then a trailing observation 6 (a transcript cut after it) and padding 7. The environment rewarded
    # turn 1 with -0.25 on its last token; the score 1 lands on the model's last token (5), never on an observation;
    # the KL penalty (k1, beta 0.5, log pi_old - log ref = 0.2 everywhere) only on the model's tokens.

    from lightning_rl.loop.estimate import estimate
    from lightning_rl.loop.metrics import WeightedMeans

    response_mask, action_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]]), torch.tensor([[1, 1, 0, 0, 1, 1, 0, 0]])
    env_rewards = torch.tensor([[0.0, -0.25, 0, 0, 0, 0, 0, 0]])
    batch = RolloutBatch(
        response_ids=torch.ones(1, 8, dtype=torch.long), response_mask=response_mask, action_mask=action_mask, env_rewards=env_rewards,
        scores=torch.tensor([1.0]), sample_mask=torch.ones(1), old_logprobs=torch.full((1, 8), -1.0), ref_logprobs=torch.full((1, 8), -1.2),
    )  # fmt: skip
    out = estimate(
        batch, ReinforcePlusPlus(gamma=1.0, whiten="none"), KLRegularizer(0.5, "k1", "reward"), WeightedMeans()
    )
    expected = torch.tensor([[-0.1, -0.35, 0, 0, -0.1, 0.9, 0, 0]])
    torch.testing.assert_close(out.token_rewards, expected, atol=1e-6, rtol=0)
    # reward-to-go over the model's tokens: 0.35, 0.45, -, -, 0.8, 0.9
    torch.testing.assert_close(out.advantages, torch.tensor([[0.35, 0.45, 0, 0, 0.8, 0.9, 0, 0]]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("surrogate", ["clipped", "cispo", "clip_cov"])
def test_the_update_path_on_a_model_gives_environment_tokens_no_gradient(tiny_model_path, monkeypatch, surrogate):
    # the optimize phase's own policy loss (lightning_rl.loop.optimize) on a tiny model: surrogate + KL in the loss +
    # entropy bonus + positive-sample NLL, aggregated over the mini-batch. The gradient reaching the logits that
    # score environment tokens is exactly zero, and policy/entropy and policy/clipfrac are means over the model's tokens.
    from types import SimpleNamespace

    import lightning_rl.core.logprobs as logprobs_module
    from lightning_rl.core.models import ModelSpec, load_causal_lm
    from lightning_rl.loop.metrics import WeightedMeans
    from lightning_rl.loop.optimize import PolicyUpdate

    policy = load_causal_lm(ModelSpec(path=tiny_model_path))
    g = torch.Generator().manual_seed(4)
    vocab = policy.config.vocab_size
    batch = RolloutBatch(
        prompt_ids=torch.randint(3, vocab, (B, 3), generator=g), prompt_mask=torch.ones(B, 3, dtype=torch.long),
        response_ids=torch.randint(3, vocab, (B, R), generator=g), response_mask=RESPONSE_MASK, action_mask=ACTION_MASK,
        advantages=torch.randn(B, R, generator=g), ref_logprobs=-3.0 * torch.rand(B, R, generator=g),
        rollout_logprobs=-3.0 * torch.rand(B, R, generator=g), scores=torch.ones(B), sample_mask=torch.ones(B), group_ids=torch.tensor([0, 0, 1, 1]),
    )  # fmt: skip
    captured = {}
    response_outputs = logprobs_module.response_outputs

    def keep(*args, **kwargs):  # the (B, R, V) logits that score the response tokens
        logits, router = response_outputs(*args, **kwargs)
        captured["logits"] = logits
        logits.retain_grad()
        return logits, router

    monkeypatch.setattr(logprobs_module, "response_outputs", keep)
    module = SimpleNamespace(
        policy=policy, loop=SimpleNamespace(logprob_chunk_rows=None, max_tokens_per_micro_batch=None),
        surrogate=SURROGATES[surrogate], kl=KLRegularizer(0.1, "k3", "loss"), loss_terms=[EntropyBonus(0.01), PositiveNLL(0.1)], aggregator=TokenMean(), teacher_logits=None, routing_replay=False,
    )  # fmt: skip
    metrics = WeightedMeans()
    torch.manual_seed(0)
    mask = batch.loss_mask
    t = 0.3  # a sharp sampler: the random model's entropies then differ from token to token
    loss = PolicyUpdate._policy_loss(module, batch, mask.sum(), mask.sum(), t, metrics, None)
    loss.backward()
    _check(captured["logits"].grad)
    values = metrics.compute(sync=False)
    entropy = logprobs_module.policy_logprobs(policy, batch, t, with_entropy=True)[1].detach()
    over_actions, over_responses = [float((entropy * m).sum() / m.sum()) for m in (mask, RESPONSE_MASK)]
    assert abs(over_actions - over_responses) > 1e-3
    assert float(values["policy/entropy"]) == pytest.approx(over_actions, abs=1e-6)
