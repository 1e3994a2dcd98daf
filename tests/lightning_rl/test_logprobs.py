import torch

from lightning_rl.batch import RolloutBatch
from lightning_rl.logprobs import policy_logprobs, sampled_logprobs, sequence_inputs, token_entropy


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
    ids, mask, pos = sequence_inputs(torch.tensor([[0, 0, 5, 6]]), torch.tensor([[0, 0, 1, 1]]), torch.tensor([[7, 1]]), torch.tensor([[1, 1]]))
    assert pos.tolist() == [[0, 0, 0, 1, 2, 3]]
    assert ids.tolist() == [[0, 0, 5, 6, 7, 1]]


def test_trainer_logprobs_ignore_left_padding(tiny_model_path):
    """The same prompt with and without extra left padding gives the same response log-probs."""
    from lightning_rl.models import ModelSpec, load_causal_lm

    model = load_causal_lm(ModelSpec(path=tiny_model_path))
    prompt = torch.tensor([[5, 6, 7]])
    response = torch.tensor([[8, 9, 1]])
    a = RolloutBatch(prompt_ids=prompt, prompt_mask=torch.ones_like(prompt), response_ids=response, response_mask=torch.ones_like(response))
    padded = torch.tensor([[0, 0, 5, 6, 7]])
    b = a.replace(prompt_ids=padded, prompt_mask=torch.tensor([[0, 0, 1, 1, 1]]))
    with torch.no_grad():
        la, _ = policy_logprobs(model, a)
        lb, _ = policy_logprobs(model, b)
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=1e-5)
