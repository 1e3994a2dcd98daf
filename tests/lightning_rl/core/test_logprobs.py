import pytest
import torch

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.inputs import sequence_inputs
from lightning_rl.core.logprobs import policy_logprobs, sampled_logprobs, token_entropy


def test_chunked_logprobs_equal_full_log_softmax_in_value_and_gradient():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, requires_grad=True)
    targets = torch.randint(0, 11, (3, 5))
    chunked = sampled_logprobs(logits, targets, temperature=0.7, chunk_rows=4)
    full = torch.log_softmax(logits / 0.7, -1).gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(chunked, full)
    w = torch.randn(3, 5)
    (g_chunked,) = torch.autograd.grad((chunked * w).sum(), logits)
    (g_full,) = torch.autograd.grad((full * w).sum(), logits)
    torch.testing.assert_close(g_chunked, g_full)


def test_bf16_logits_are_reduced_in_fp32():
    torch.manual_seed(0)
    logits = torch.randn(4, 6, 50).to(torch.bfloat16)
    targets = torch.randint(0, 50, (4, 6))
    out = sampled_logprobs(logits, targets)
    assert out.dtype == torch.float32
    ref = torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(out, ref)


def test_entropy_matches_definition_with_and_without_grad():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 9, requires_grad=True)
    ent = token_entropy(logits, temperature=2.0, chunk_rows=2)
    p = torch.softmax(logits / 2.0, -1)
    ref = -(p * p.log()).sum(-1)
    torch.testing.assert_close(ent, ref)
    (g,) = torch.autograd.grad(ent.sum(), logits)
    (g_ref,) = torch.autograd.grad(ref.sum(), logits)
    torch.testing.assert_close(g, g_ref)


def test_position_ids_skip_left_padding():
    ids, mask, pos = sequence_inputs(
        torch.tensor([[0, 0, 5, 6]]), torch.tensor([[0, 0, 1, 1]]), torch.tensor([[7, 1]]), torch.tensor([[1, 1]])
    )
    assert pos.tolist() == [[0, 0, 0, 1, 2, 3]]
    assert ids.tolist() == [[0, 0, 5, 6, 7, 1]]


def test_trainer_logprobs_ignore_left_padding(tiny_model_path):
    """The same prompt with and without extra left padding gives the same response log-probs."""
    from lightning_rl.core.models import ModelSpec, load_causal_lm

    model = load_causal_lm(ModelSpec(path=tiny_model_path))
    prompt = torch.tensor([[5, 6, 7]])
    response = torch.tensor([[8, 9, 1]])
    a = RolloutBatch(
        prompt_ids=prompt,
        prompt_mask=torch.ones_like(prompt),
        response_ids=response,
        response_mask=torch.ones_like(response),
    )
    padded = torch.tensor([[0, 0, 5, 6, 7]])
    b = a.replace(prompt_ids=padded, prompt_mask=torch.tensor([[0, 0, 1, 1, 1]]))
    with torch.no_grad():
        la, _ = policy_logprobs(model, a)
        lb, _ = policy_logprobs(model, b)
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=1e-5)


def test_shared_prompts_finds_runs_of_identical_rows():
    from lightning_rl.core.logprobs import shared_prompts

    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [7, 8, 9], [7, 8, 9], [0, 5, 6]])
    assert shared_prompts(ids, (ids > 0).long()) == [2, 3, 1]
    assert shared_prompts(ids[[0, 2, 5]], (ids[[0, 2, 5]] > 0).long()) is None  # nothing to share
    same_ids_other_mask = shared_prompts(ids[:2], torch.tensor([[0, 1, 1], [1, 1, 1]]))
    assert same_ids_other_mask is None


def _full_logits(model, batch):
    """The forward pass without prefix sharing: the whole (prompt + response) of every row."""
    ids, mask, pos = sequence_inputs(batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
    r = batch.response_ids.shape[1]
    return model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits[:, -(r + 1) : -1]


LAYOUTS = {  # (runs of identical prompts, attention implementation, longest packed row allowed)
    "packed-sdpa": ([3, 3], "sdpa", 1024),
    "packed-eager": ([3, 3], "eager", 1024),
    "kv-cache": ([3, 3], "sdpa", 0),
    "kv-cache-unequal-runs": ([2, 4], "sdpa", 1024),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_shared_prefix_forward_equals_the_full_forward_in_value_and_gradient(tiny_model_path, layout, monkeypatch):
    """Runs of 2 left-padded prompts, responses right-padded: same log-probs, same parameter gradients, whichever
    layout shares the prompt (one packed call per group, or the prompts' KV cache repeated to their rows)."""
    from lightning_rl.core import logprobs
    from lightning_rl.core.models import ModelSpec, load_causal_lm

    runs, attention, max_tokens = LAYOUTS[layout]
    monkeypatch.setattr(logprobs, "PACKED_ROW_MAX_TOKENS", max_tokens)
    model = load_causal_lm(ModelSpec(path=tiny_model_path, attn_implementation=attention)).train()
    calls = []
    model.register_forward_hook(lambda _m, _a, kwargs, _o: calls.append(kwargs["input_ids"].shape), with_kwargs=True)
    prompts = torch.tensor([[0, 5, 6, 7], [9, 8, 7, 6]]).repeat_interleave(torch.tensor(runs), 0)  # (6, 4)
    torch.manual_seed(0)
    response = torch.randint(3, 15, (6, 5))
    response_mask = (torch.arange(5)[None] < torch.tensor([5, 2, 1, 4, 5, 3])[:, None]).long()
    batch = RolloutBatch(
        prompt_ids=prompts,
        prompt_mask=(prompts > 0).long(),
        response_ids=response * response_mask,
        response_mask=response_mask,
    )
    weights = torch.randn(6, 5) * response_mask
    grads = []
    for logits_fn in (
        _full_logits,
        lambda m, b: logprobs.response_logits(m, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask),
    ):
        model.zero_grad()
        calls.clear()
        values = sampled_logprobs(logits_fn(model, batch), batch.response_ids) * response_mask
        (values * weights).sum().backward()
        grads.append((values.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    assert len(calls) == (1 if layout.startswith("packed") else 2)  # the layout under test ran
    if layout.startswith("packed"):  # a group per row, each response without its trailing padding: the wider
        assert calls == [(2, 4 + (4 + 5 + 3))]  # group's 12 tokens after the prompt's 4 (3 x 5 with padding)
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=1e-4, atol=1e-5)


def test_packing_needs_a_mask_taking_attention_a_short_row_and_no_shorter_sliding_window(tiny_model_path, monkeypatch):
    from lightning_rl.core import logprobs
    from lightning_rl.core.models import ModelSpec, load_causal_lm

    model = load_causal_lm(ModelSpec(path=tiny_model_path))
    assert logprobs._packable(model, p=10, row_tokens=8 * 20, longest=20)  # 170 tokens
    assert not logprobs._packable(model, p=24, row_tokens=8 * 126, longest=126)  # 24 + 8 x 126 = 1,032 tokens
    model.config.sliding_window = 16
    assert not logprobs._packable(model, p=10, row_tokens=160, longest=20)  # a response's context (30) exceeds it
    assert logprobs._packable(model, p=10, row_tokens=160, longest=6)  # the longest response's does not (16)
    model.config.sliding_window = 4096
    assert logprobs._packable(model, p=10, row_tokens=160, longest=20)
    monkeypatch.setattr(model.config, "_attn_implementation", "flash_attention_2")  # varlen kernels take no custom mask
    assert not logprobs._packable(model, p=10, row_tokens=160, longest=20)


def test_shared_prefix_with_one_response_token(tiny_model_path):
    from lightning_rl.core.logprobs import response_logits
    from lightning_rl.core.models import ModelSpec, load_causal_lm

    model = load_causal_lm(ModelSpec(path=tiny_model_path))
    prompts = torch.tensor([[5, 6, 7]]).repeat(4, 1)
    batch = RolloutBatch(
        prompt_ids=prompts,
        prompt_mask=torch.ones_like(prompts),
        response_ids=torch.tensor([[8], [9], [1], [8]]),
        response_mask=torch.ones(4, 1, dtype=torch.long),
    )
    with torch.no_grad():
        shared = response_logits(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
        torch.testing.assert_close(shared, _full_logits(model, batch), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("max_tokens", [1024, 0], ids=["packed", "no-packing"])
def test_shared_prefix_under_activation_checkpointing(tiny_model_path, max_tokens, monkeypatch):
    """transformers drops the KV cache in checkpointed layers while training: the packed layout (no cache) still
    shares the prompt; without it the full forward runs instead."""
    from lightning_rl.core import logprobs
    from lightning_rl.core.models import ModelSpec, load_causal_lm

    monkeypatch.setattr(logprobs, "PACKED_ROW_MAX_TOKENS", max_tokens)
    model = load_causal_lm(ModelSpec(path=tiny_model_path, gradient_checkpointing=True)).train()
    prompts = torch.tensor([[5, 6, 7]]).repeat(3, 1)
    batch = RolloutBatch(
        prompt_ids=prompts,
        prompt_mask=torch.ones_like(prompts),
        response_ids=torch.tensor([[8, 9], [9, 1], [1, 0]]),
        response_mask=torch.tensor([[1, 1], [1, 1], [1, 0]]),
    )
    shared = logprobs.response_logits(
        model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask
    )
    real = batch.response_mask.bool()
    torch.testing.assert_close(shared[real], _full_logits(model, batch)[real], rtol=1e-5, atol=1e-5)
    if max_tokens:  # the packed row leaves out each response's trailing padding: zero logits there
        assert not shared[~real].any()
    shared.sum().backward()  # the checkpointed layers recompute and backpropagate


def test_a_packed_response_ends_at_its_last_real_token_keeping_masked_tokens_before_it():
    from lightning_rl.core.logprobs import _response_extents

    mask = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    assert _response_extents(mask).tolist() == [3, 0, 4, 2]
