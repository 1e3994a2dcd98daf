"""A scripted token-in/token-out sampler and stand-in environments for MultiTurnRollout (tests/components/test_multi_turn.py,
test_chat_turns.py), and the cancellation scenario the fault matrix (tests/test_fault_matrix.py) runs too."""

from __future__ import annotations

import threading

import torch

from components.rollout import MultiTurnRollout
from components.rollout.base import response_mask_from_eos
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Environment, Rollout, Step
from lightning_rl.core.sampling_params import SamplingParams
from tests.helpers import prompts


class Echo(Environment):
    """Observes ``observation`` after every turn until turn ``turns``; rewards the first turn with ``reward``."""

    def __init__(self, observation="=7 ", turns: int = 3, reward: float | None = 0.5, tool_calls: int = 1):
        self.observation, self.turns, self.reward, self.tool_calls = observation, turns, reward, tool_calls

    def reset(self, row):
        return {"seen": [], "row": row}

    def step(self, state, turn):
        state["seen"].append(turn)
        if turn.index + 1 >= self.turns:
            return Step(done=True)
        return Step(self.observation, self.reward if turn.index == 0 else None, False, self.tool_calls, 0)


class Scripted(Rollout):
    """A token-in/token-out sampler that answers each call with the next scripted turns (one list of ids per row)."""

    def __init__(self, script: list[list[list[int]]], eos: int, group_size: int = 1):
        self.script, self.params = list(script), SamplingParams(group_size=group_size, max_new_tokens=64)
        self.contexts, self.budgets, self.eos_token_id, self.pad_token_id = [], [], eos, 0

    def generate(self, prompts, policy, params=None):
        params = params or self.params
        self.contexts.append([ids[m.bool()].tolist() for ids, m in zip(prompts.prompt_ids, prompts.prompt_mask)])
        self.budgets.append(params.max_new_tokens)
        turns = [t[: params.max_new_tokens] for t in self.script.pop(0)]  # like any sampler, at most max_new_tokens
        assert len(turns) == len(prompts) * params.samples_per_prompt
        width = max(len(t) for t in turns)
        ids = torch.tensor([t + [self.pad_token_id] * (width - len(t)) for t in turns])
        mask, truncated = response_mask_from_eos(ids, params.eos_ids(self.eos_token_id))
        mask = mask * (torch.arange(width)[None] < torch.tensor([len(t) for t in turns])[:, None])
        logprobs = -0.01 * torch.arange(1, width + 1).float().expand(len(turns), width) * mask
        return RolloutBatch(
            response_ids=ids,
            response_mask=mask,
            truncated=truncated,
            rollout_logprobs=logprobs,
            versions=torch.full((ids.shape[0],), 3),
        )


class Blocking(Echo):
    """Its first step waits until the environment is closed (a tool call stuck until the run's teardown)."""

    def __init__(self):
        super().__init__(turns=10)
        self.closed, self.stepped = threading.Event(), threading.Event()
        self.steps = 0

    def step(self, state, turn):
        self.steps += 1
        self.stepped.set()
        self.closed.wait()
        return super().step(state, turn)

    def close(self):
        self.closed.set()


def make_agent(env, tokenizer, sampler, **kwargs) -> MultiTurnRollout:
    kwargs.setdefault("max_total_tokens", 256)  # most of these run without a policy: no context to derive it from
    agent = MultiTurnRollout(env, **kwargs)
    agent.setup(tokenizer, sampler)
    return agent


def check_cancel_ends_the_episodes_of_a_generate_under_way(tokenizer):
    """An asynchronous run's teardown cancels the round sampling ahead: the step under way is released (the environment is
    closed), and every episode ends at its next turn, flagged truncated, without the environment."""
    eos, enc = tokenizer.eos_token_id, lambda s: tokenizer.encode(s, add_special_tokens=False)
    sampler = Scripted([[enc("1"), enc("2")], [enc("3")]], eos, group_size=2)
    env = Blocking()
    agent = make_agent(env, tokenizer, sampler, max_turns=5, max_concurrent_tools=1)  # the steps one after another
    prompt = torch.tensor([enc("1+1=")])
    result = []
    thread = threading.Thread(target=lambda: result.append(agent.generate(sampler, prompts(prompt), None)), daemon=True)
    thread.start()
    assert env.stepped.wait(10.0)
    agent.cancel()
    thread.join(10.0)
    assert not thread.is_alive()
    batch, _ = result[0]
    assert env.steps == 1 and batch.truncated.tolist() == [True, True]
    assert batch.response_ids[0].tolist() == enc("1=7 3") and batch.response_ids[1, :1].tolist() == enc("2")
    assert agent._running == set() and agent._cancelled == set()
