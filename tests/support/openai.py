"""A scripted chat sampler for the OpenAI-endpoint tests: each chat family's turns, by the tool results in the context."""

from __future__ import annotations

import torch

from components.rollout.base import response_mask_from_eos
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Rollout
from lightning_rl.core.sampling_params import SamplingParams

HERMES = '<tool_call>\n{"name": "calc", "arguments": {"expression": "1+2"}}\n</tool_call>'
NESTED = "[" * 1000 + "]" * 1000  # a call's arguments as a model may write them
# the model's turns, by the number of tool results already in its context
TURNS = {
    "chatml": [HERMES + "<|im_end|>", "Again:\n" + HERMES + "<|im_end|>", "3<|im_end|>"],
    "llama3": ['{"name": "calc", "parameters": {"expression": "1+2"}}<|eot_id|>'] * 2 + ["3<|eot_id|>"],
    "thinking": [
        "<think>\nadd\n</think>\n\n" + HERMES + "<|im_end|>",
        "<think>\nagain\n</think>\n\n" + HERMES + "<|im_end|>",
        "<think>\ndone\n</think>\n\n3<|im_end|>",
    ],
    "answer": ["3<|im_end|>"] * 3,  # ChatML, no call
    "deep_hermes": ['<tool_call>\n{"name": "calc", "arguments": ' + NESTED + "}\n</tool_call><|im_end|>"] * 3,
    "deep_json": ['{"name": "calc", "parameters": ' + NESTED + "}<|eot_id|>"] * 3,
}
TOOL_RESULT = {
    "chatml": "<tool_response>",
    "llama3": "ipython<|end_header_id|>",
    "thinking": "<tool_response>",
    "answer": "<tool_response>",
    "deep_hermes": "<tool_response>",
    "deep_json": "ipython<|end_header_id|>",
}


class ScriptedChat(Rollout):
    """Answers each context with the family's next turn (by the tool results it holds), log-prob -0.1 per token."""

    def __init__(self, tokenizer, family: str, group_size: int = 1):
        self.tokenizer, self.family = tokenizer, family
        self.params, self.provides = (
            SamplingParams(group_size=group_size, max_new_tokens=200),
            Rollout.provides | {"rollout_logprobs"},
        )

    def generate(self, prompts, policy, params=None):
        turns = []
        for ids, mask in zip(prompts.prompt_ids, prompts.prompt_mask):
            context = self.tokenizer.decode(ids[mask.bool()].tolist())
            turns.append(
                self.tokenizer.encode(
                    TURNS[self.family][context.count(TOOL_RESULT[self.family])], add_special_tokens=False
                )
            )
        width = max(len(t) for t in turns)
        ids = torch.tensor([t + [self.pad_token_id] * (width - len(t)) for t in turns])
        mask, truncated = response_mask_from_eos(ids, (params or self.params).eos_ids(self.eos_token_id))
        return RolloutBatch(
            response_ids=ids,
            response_mask=mask,
            truncated=truncated,
            rollout_logprobs=-0.1 * mask.float(),
            versions=torch.zeros(len(turns), dtype=torch.long),
        )


class EndlessSampler(ScriptedChat):
    """A sampler call that runs ``seconds`` (stepping as a decoding loop does, checking for a stop between steps)
    before it answers: the stand-in for a long ``generate`` in flight. ``calls`` records when each started."""

    def __init__(self, tokenizer, family: str, group_size: int = 1, seconds: float = 30.0):
        super().__init__(tokenizer, family, group_size)
        self.seconds, self.calls = seconds, []

    def generate(self, prompts, policy, params=None):
        import time

        from components.rollout.interrupt import check_interrupted

        self.calls.append(time.monotonic())
        end = time.monotonic() + self.seconds
        while time.monotonic() < end:
            check_interrupted()
            time.sleep(0.005)
        return super().generate(prompts, policy, params)
