"""Vision-language policies: the sampler and the trainer see the same image tokens and positions.

HFRollout's sampled log-probs equal the trainer's recomputation (policy_logprobs) to 1e-5 on a tiny Qwen2-VL,
Qwen2.5-VL and Qwen3-VL built locally, with several images per prompt, prompts without images, left padding and two prompts that
read the same token ids but show different pictures, in one batch; micro-batches equal the one-batch pass; token-budget
packing refuses a batch with images.
"""

from __future__ import annotations

import pytest
import torch

from lightning_rl.core.logprobs import policy_logprobs, shared_prompts
from lightning_rl.core.microbatch import micro_batches
from lightning_rl.core.models import ModelSpec, load_causal_lm, load_tokenizer
from tests.support.vlm import sample

TOL = 1e-5


def max_diff(a, b, mask):
    return float(((a - b).abs() * mask).max())


@pytest.mark.parametrize("family", ["tiny_vlm_path", "tiny_vlm25_path", "tiny_vlm3_path"])
@pytest.mark.parametrize(
    "group_size", [1, 3]
)  # 1: one causal pass per row; 3: each prompt's KV cache shared by its group
def test_sampled_logprobs_equal_the_trainers_recomputation(family, group_size, request):
    path = request.getfixturevalue(family)
    policy, batch = sample(path, group_size)
    assert batch.image_inputs is not None and len(batch.image_inputs) == batch.batch_size == 4 * group_size
    assert batch.prompt_mask[:, 0].tolist().count(0) >= group_size  # left padding in the batch
    assert batch.response_mask.sum() > 4 * group_size  # responses of several tokens
    with torch.no_grad():
        logprobs, _ = policy_logprobs(policy, batch, temperature=1.0)
    mask = batch.response_mask.float()
    assert max_diff(logprobs, batch.rollout_logprobs, mask) < TOL


def test_micro_batches_equal_the_one_batch_pass(tiny_vlm_path):
    policy, batch = sample(tiny_vlm_path, group_size=2)
    with torch.no_grad():
        whole, _ = policy_logprobs(policy, batch)
        for size in (1, 3):
            parts = [policy_logprobs(policy, micro)[0] for micro in micro_batches(batch, size, None)]
            assert max_diff(torch.cat(parts), whole, batch.response_mask.float()) < TOL


@pytest.mark.parametrize("family", ["tiny_vlm_path", "tiny_vlm3_path"])
def test_the_images_decide_the_logprobs_and_never_merge_prompts_that_read_the_same_ids(family, request):
    policy, batch = sample(request.getfixturevalue(family), group_size=2)
    first, second = batch.select(slice(0, 2)), batch.select(slice(2, 4))
    assert torch.equal(first.prompt_ids, second.prompt_ids)  # same text, same-sized images: the same token ids
    both = first.replace(response_ids=second.response_ids, response_mask=second.response_mask)  # the second's responses
    runs = shared_prompts(batch.prompt_ids, batch.prompt_mask, batch.image_inputs)
    assert runs[:2] == [2, 2]  # a group of 2, then another: not one run of 4
    with torch.no_grad():
        own = policy_logprobs(policy, second)[0]
        other_picture = policy_logprobs(policy, both)[0]
    assert max_diff(own, other_picture, second.response_mask.float()) > 1e-3


def test_token_budget_packing_refuses_a_batch_with_images(tiny_vlm_path):
    policy, batch = sample(tiny_vlm_path, group_size=1)
    with pytest.raises(ValueError, match="model.loop.max_tokens_per_micro_batch"):
        policy_logprobs(policy, batch, packed=True)


def test_text_rows_of_a_vlm_keep_one_dimensional_positions(tiny_vlm_path):
    """A vision-language policy on text-only data reads mask positions, as a text model: no image inputs, no 3-D rotary index."""
    from components.rollout import HFRollout
    from tests.helpers import prompts

    policy = load_causal_lm(ModelSpec(path=tiny_vlm_path))
    tokenizer = load_tokenizer(tiny_vlm_path)
    rollout = HFRollout(group_size=2, max_new_tokens=5, return_logprobs=True)
    rollout.setup(tokenizer)
    ids = [tokenizer("12+3=")["input_ids"], tokenizer("1+1=")["input_ids"]]
    width = max(map(len, ids))
    padded = [[tokenizer.pad_token_id] * (width - len(x)) + x for x in ids]
    mask = [[0] * (width - len(x)) + [1] * len(x) for x in ids]
    torch.manual_seed(0)
    batch = rollout.generate(prompts(padded, mask), policy)
    assert batch.image_inputs is None
    with torch.no_grad():
        logprobs, _ = policy_logprobs(policy, batch)
    assert max_diff(logprobs, batch.rollout_logprobs, batch.response_mask.float()) < TOL
