import pytest
import torch

from components.critic import ValueCritic
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.ops import explained_variance
from lightning_rl.recipes.reward_model import save_tiny_reward_model


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory) -> str:
    return save_tiny_reward_model(tmp_path_factory.mktemp("tiny-rm"), seed=5)


def _loss_batch(values_old, returns, mask=None) -> RolloutBatch:
    old = torch.tensor(values_old)
    mask = torch.ones_like(old, dtype=torch.long) if mask is None else torch.tensor(mask)
    return RolloutBatch(
        response_ids=torch.ones_like(mask), response_mask=mask, values=old, returns=torch.tensor(returns)
    )


def _seq_batch(prompts, responses, r_width=5) -> RolloutBatch:
    p_width = max(map(len, prompts))
    b = len(prompts)
    prompt_ids, prompt_mask = torch.zeros(b, p_width, dtype=torch.long), torch.zeros(b, p_width, dtype=torch.long)
    response_ids, response_mask = torch.zeros(b, r_width, dtype=torch.long), torch.zeros(b, r_width, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        prompt_ids[i, p_width - len(p) :], prompt_mask[i, p_width - len(p) :] = torch.tensor(p), 1
        response_ids[i, : len(r)], response_mask[i, : len(r)] = torch.tensor(r), 1
    return RolloutBatch(
        response_ids=response_ids, response_mask=response_mask, prompt_ids=prompt_ids, prompt_mask=prompt_mask
    )


def test_unclipped_loss_is_half_squared_error():
    critic = ValueCritic()
    batch = _loss_batch([[0.5, 0.5]], [[1.0, 0.0]])
    loss, metrics = critic.loss(torch.tensor([[0.9, 0.3]]), batch)
    torch.testing.assert_close(loss, torch.tensor([[0.5 * 0.01, 0.5 * 0.09]]), atol=1e-7, rtol=0)
    assert float(metrics["critic/clipfrac"]) == 0.0
    assert float(metrics["critic/values_mean"]) == pytest.approx(0.6)


def test_value_clipping_changes_the_loss_hand_computed():
    # V_old 0.5, target 1.0, new V 0.9: unclipped 0.5 * 0.1^2 = 0.005; clipped V = 0.5 + 0.2 = 0.7 -> 0.5 * 0.3^2 = 0.045
    # second token: V moves away from its target inside the clip range: both branches equal
    batch = _loss_batch([[0.5, 0.5]], [[1.0, 0.0]])
    values = torch.tensor([[0.9, 0.6]])
    plain, _ = ValueCritic().loss(values, batch)
    clipped, metrics = ValueCritic(value_clip=0.2).loss(values, batch)
    torch.testing.assert_close(clipped, torch.tensor([[0.045, 0.18]]), atol=1e-7, rtol=0)
    torch.testing.assert_close(plain, torch.tensor([[0.005, 0.18]]), atol=1e-7, rtol=0)
    assert float(metrics["critic/clipfrac"]) == pytest.approx(0.5)


def test_value_clipping_blocks_the_gradient_past_the_clip():
    batch = _loss_batch([[0.5]], [[1.0]])
    values = torch.tensor([[0.9]], requires_grad=True)
    loss, _ = ValueCritic(value_clip=0.2).loss(values, batch)
    loss.sum().backward()
    assert float(values.grad) == 0.0  # the clipped branch wins and is constant in V


def test_explained_variance_perfect_constant_and_masked():
    torch.manual_seed(0)
    returns = torch.randn(4, 6)
    mask = torch.ones(4, 6)
    mask[1, 3:] = 0
    assert float(explained_variance(returns, returns, mask)) == pytest.approx(1.0, abs=1e-6)
    constant = torch.full_like(returns, 0.37)
    assert float(explained_variance(constant, returns, mask)) == pytest.approx(0.0, abs=1e-6)
    # a critic off by independent noise: 1 - Var(noise) / Var(returns), over unmasked tokens only
    noisy = returns + 0.5 * torch.randn(4, 6)
    garbage = noisy.clone()
    garbage[1, 3:] = 100.0
    keep = mask.bool()
    expected = 1 - (returns - noisy)[keep].var(correction=0) / returns[keep].var(correction=0)
    torch.testing.assert_close(explained_variance(garbage, returns, mask), expected, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_values_are_read_before_each_token(tiny_model_path):
    critic = ValueCritic(init_from="policy")
    critic.build(tiny_model_path)
    torch.nn.init.normal_(critic.head.weight)  # the policy-initialised head is zero
    batch = _seq_batch([[5, 6, 7]], [[8, 9, 10, 1]])
    values = critic(batch)
    changed = critic(batch.replace(response_ids=torch.tensor([[8, 9, 12, 1, 0]])))
    # V(s_t) sees tokens before t: changing token 2 leaves V_0..V_2 and changes V_3
    assert torch.equal(values[:, :3], changed[:, :3]) and not torch.allclose(values[:, 3], changed[:, 3])
    assert float(values[0, 4]) == 0.0  # padding


@pytest.mark.parametrize("packed", [False, True])
@torch.no_grad()
def test_values_stay_fp32_under_bf16_autocast(tiny_model_path, packed):
    """Lightning's bf16-mixed runs every forward under autocast (on CPU as on a GPU): the transformer may run in bf16,
    but the value head is fp32 and so are the values. 1000.125 has no bf16 neighbour closer than 1000 (8 bits of
    mantissa): a head run in bf16 would return 1000."""
    critic = ValueCritic(init_from="policy")
    critic.build(tiny_model_path)
    torch.nn.init.zeros_(critic.head.weight)
    critic.head.bias.fill_(1000.125)
    batch = _seq_batch([[5, 6, 7], [4, 5]], [[8, 9, 1], [3]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        values = critic(batch, packed=packed)
    assert values.dtype == torch.float32
    assert values[batch.response_mask.bool()].tolist() == [1000.125] * 4


@torch.no_grad()
def test_left_padding_does_not_change_values(tiny_model_path):
    critic = ValueCritic(init_from="policy")
    critic.build(tiny_model_path)
    torch.nn.init.normal_(critic.head.weight)
    alone = critic(_seq_batch([[5, 6, 7]], [[8, 9, 1]]))
    padded = critic(_seq_batch([[5, 6, 7], [4, 5, 6, 7, 8, 9]], [[8, 9, 1], [3]]))
    torch.testing.assert_close(padded[:1], alone, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_init_from_policy_starts_at_zero_and_from_reward_model_copies_its_head(tiny_model_path, rm_path):
    from transformers import AutoModelForSequenceClassification

    batch = _seq_batch([[5, 6, 7]], [[8, 9, 1]])
    from_policy = ValueCritic(init_from="policy")
    from_policy.build(tiny_model_path)
    assert torch.equal(from_policy(batch), torch.zeros(1, 5))
    from_rm = ValueCritic(init_from="reward_model")
    from_rm.build(tiny_model_path, rm_path)
    rm = AutoModelForSequenceClassification.from_pretrained(rm_path, num_labels=1)
    assert torch.equal(from_rm.head.weight, rm.score.weight)
    # the critic's value before the last token equals the reward model's score of the prefix up to it
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    torch.testing.assert_close(from_rm(batch)[0, 2], rm(input_ids=ids).logits[0, 0], atol=1e-5, rtol=1e-5)
    # distinct parameters from the reward model it was initialised from
    assert {p.data_ptr() for p in from_rm.parameters()}.isdisjoint({p.data_ptr() for p in rm.parameters()})


def test_configuration_errors_name_the_fix(tiny_model_path):
    with pytest.raises(ValueError, match="init_args.path"):
        ValueCritic(init_from="path")
    with pytest.raises(ValueError, match="RewardModel"):
        ValueCritic(init_from="reward_model").build(tiny_model_path, None)
    with pytest.raises(RuntimeError, match="build"):
        ValueCritic()(_seq_batch([[5]], [[6]]))
