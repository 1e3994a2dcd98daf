"""Token-budget micro-batches and padding-free packing: same loss and gradients as the padded single batch."""

import pytest
import torch

from components.aggregator import SeqMeanTokenMean, SeqMeanTokenSum, TokenMean, TokenSumNorm
from lightning_rl.core import packing
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.logprobs import policy_logprobs
from lightning_rl.core.microbatch import micro_batches, token_budget_groups, trim


def test_token_budget_groups_are_consecutive_and_within_budget():
    assert token_budget_groups([3, 4, 2, 6, 1, 9, 1], 7) == [(0, 2), (2, 3), (3, 5), (5, 6), (6, 7)]
    assert token_budget_groups([12, 1], 10) == [(0, 1), (1, 2)]  # a sample past the budget stands alone
    assert token_budget_groups([], 10) == []
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch"):
        token_budget_groups([1], 0)


def test_trim_cuts_padding_on_both_sides():
    batch = RolloutBatch(
        prompt_ids=torch.tensor([[0, 0, 5, 6], [0, 7, 8, 9]]),
        prompt_mask=torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]]),
        response_ids=torch.tensor([[4, 0, 0, 0], [4, 5, 0, 0]]),
        response_mask=torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0]]),
        advantages=torch.ones(2, 4),
    )
    small = trim(batch)
    assert small.prompt_ids.tolist() == [[0, 5, 6], [7, 8, 9]]
    assert small.response_ids.tolist() == [[4, 0], [4, 5]] and small.advantages.shape == (2, 2)


def _model(kind: str, attention: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    small = dict(
        vocab_size=20,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    config = (LlamaConfig if kind == "llama" else Qwen2Config)(**small, attn_implementation=attention)
    model = (LlamaForCausalLM if kind == "llama" else Qwen2ForCausalLM)(config).train()
    # float64 pins the comparison to the layout; eager attention in float64 turns fully masked padding rows into NaN
    return model if attention == "eager" else model.double()


def _batch(seed: int = 0) -> RolloutBatch:
    """3 groups of 3 (and one lone sample): left-padded prompts of 2-5 tokens, responses of 1-9 tokens."""
    g = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.tensor([5, 5, 5, 2, 2, 2, 4, 4, 4, 3])
    response_lengths = torch.tensor([9, 1, 4, 7, 2, 9, 3, 8, 5, 6])
    prompts = torch.randint(3, 20, (4, 5), generator=g)[torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3])]
    prompt_mask = (torch.arange(5)[None] >= 5 - prompt_lengths[:, None]).long()
    response_mask = (torch.arange(9)[None] < response_lengths[:, None]).long()
    return RolloutBatch(
        prompt_ids=prompts * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(3, 20, (10, 9), generator=g) * response_mask,
        response_mask=response_mask,
        old_logprobs=-torch.rand(10, 9, generator=g, dtype=torch.float64) * response_mask,
        advantages=torch.randn(10, 9, generator=g, dtype=torch.float64) * response_mask,
        sample_mask=torch.tensor([1.0] * 9 + [0.0]),
    )


def _loss_and_grads(model, batch, aggregator, budget):
    """The clipped PPO surrogate aggregated over ``batch`` (one padded pass, or token-budget packed micro-batches)."""
    model.zero_grad()
    total = aggregator.denominator(batch.loss_mask)
    loss = 0.0
    for micro in micro_batches(batch, batch.batch_size, budget):
        logprobs, entropy = policy_logprobs(
            model, micro, 0.7, with_entropy=True, entropy_grad=True, chunk_rows=7, packed=budget is not None
        )
        ratio = (logprobs - micro.old_logprobs).exp()
        per_token = -torch.minimum(ratio * micro.advantages, ratio.clamp(0.8, 1.2) * micro.advantages) - 0.01 * entropy
        part = aggregator(per_token, micro.loss_mask, total)
        part.backward()
        loss = loss + part.detach()
    return loss, torch.cat([p.grad.flatten() for p in model.parameters()])


AGGREGATORS = [TokenMean(), SeqMeanTokenMean(), SeqMeanTokenSum(), TokenSumNorm(constant=16.0)]


@pytest.mark.parametrize("aggregator", AGGREGATORS, ids=lambda a: type(a).__name__)
def test_token_budget_packed_micro_batches_equal_the_padded_batch(aggregator):
    model, batch = _model("llama", "sdpa"), _batch()
    assert len(micro_batches(batch, 10, 24)) >= 3  # the budget does split the batch
    loss, grads = _loss_and_grads(model, batch, aggregator, None)
    packed_loss, packed_grads = _loss_and_grads(model, batch, aggregator, 24)
    torch.testing.assert_close(packed_loss, loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed_grads, grads, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind,attention", [("llama", "eager"), ("qwen2", "sdpa"), ("qwen2", "eager")])
def test_packed_logprobs_equal_the_padded_forward_for_each_backend(kind, attention):
    model, batch = _model(kind, attention), _batch(seed=1)
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    padded, padded_entropy = policy_logprobs(model, batch, with_entropy=True)
    calls.clear()
    packed, packed_entropy = policy_logprobs(model, batch, with_entropy=True, packed=True)
    assert len(calls) == 1  # the whole batch in one packed row
    torch.testing.assert_close(packed, padded * batch.response_mask, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed_entropy, padded_entropy * batch.response_mask, rtol=1e-5, atol=1e-5)


def test_a_packed_row_has_no_padding_and_shares_each_prompt():
    batch = _batch()
    row = packing.pack(batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
    shared = 5 + 2 + 4 + 3  # each group's prompt once
    assert row.input_ids.shape == (1, shared + int(batch.response_mask.sum()))
    assert row.position_ids[0, :7].tolist() == [0, 1, 2, 3, 4, 5, 6]  # prompt 0, then response 0 from position 5
    # responses 1 (column 14) and 2 (columns 15-18) restart at 5, then group 1's prompt at 0
    assert row.position_ids[0, 14:20].tolist() == [5, 5, 6, 7, 8, 0]
    mask = row.attention_mask[0, 0]
    assert mask[5, :6].all() and not mask[14, 5]  # response 0 sees its prompt; response 1 does not see response 0
    assert not mask[20, :19].any()  # group 1's prompt (first column 19) sees nothing of group 0


def test_mutating_the_packed_mask_breaks_equality(monkeypatch):
    """Plain causal attention over the packed row (responses seeing earlier samples) must change the values."""
    model, batch = _model("llama", "sdpa"), _batch()
    padded = policy_logprobs(model, batch)[0] * batch.response_mask
    monkeypatch.setattr(
        packing,
        "block_causal_mask",
        lambda segment, prompt_of: torch.ones(len(segment), len(segment), dtype=torch.bool).tril(),
    )
    packed = policy_logprobs(model, batch, packed=True)[0]
    assert (packed - padded).abs().max() > 1e-3


def test_critic_values_packed_equal_padded_in_value_and_gradient():
    from transformers import LlamaConfig, LlamaModel

    from components.critic import ValueCritic

    torch.manual_seed(0)
    critic = ValueCritic()
    critic.backbone = LlamaModel(
        LlamaConfig(vocab_size=20, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    ).double()
    critic.head = torch.nn.Linear(32, 1)
    torch.nn.init.normal_(critic.head.weight)
    batch = _batch(seed=2)
    results = []
    for packed in (False, True):
        critic.zero_grad()
        values = critic(batch, packed=packed)
        values.square().sum().backward()
        results.append((values.detach(), torch.cat([p.grad.flatten() for p in critic.parameters()])))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-4, atol=1e-5)
