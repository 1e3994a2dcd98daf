"""A dense reward and a probe batch shared by the export and LoRA tests."""

from __future__ import annotations

import torch

from lightning_rl.core.batch import RolloutBatch

DENSE_REWARD = [
    "--model.reward=components.reward.FunctionReward",
    "--model.reward.fn=tests.lightning_rl.rewards.digit_count",
    "--model.rollout.init_args.temperature=3.0",
]


def probe_batch(tokenizer) -> RolloutBatch:
    """Two left-padded prompts with right-padded responses (one shorter than the other)."""
    prompts = tokenizer(["12+7=", "3*45="], padding=True, return_tensors="pt")
    response_ids = torch.tensor([[4, 3, 1, 0], [7, 9, 6, 1]])
    return RolloutBatch(
        prompt_ids=prompts["input_ids"],
        prompt_mask=prompts["attention_mask"],
        response_ids=response_ids,
        response_mask=(torch.arange(4) < torch.tensor([[3], [4]])).long(),
    )
