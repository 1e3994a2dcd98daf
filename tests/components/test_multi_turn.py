"""MultiTurnRollout: transcripts built from the exact sampled ids, environment tokens marked, budgets that truncate
and flag, clear errors for a misbehaving environment, and trainer log-probs equal to the sampler's on HF and SGLang."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch

from components.env import Environment, Step
from components.rollout import HFRollout, MultiTurnRollout, Rollout, SGLangRollout
from components.rollout.base import response_mask_from_eos
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.logprobs import policy_logprobs
from lightning_rl.core.models import ModelSpec, load_causal_lm
from lightning_rl.core.sampling import SamplingParams
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
        return RolloutBatch(response_ids=ids, response_mask=mask, truncated=truncated, rollout_logprobs=logprobs, versions=torch.full((ids.shape[0],), 3))


def _agent(env, tokenizer, sampler, **kwargs) -> MultiTurnRollout:
    agent = MultiTurnRollout(env, **kwargs)
    agent.setup(tokenizer, sampler)
    return agent


def test_transcript_layout_masks_rewards_and_contexts(tokenizer):
    eos, enc = tokenizer.eos_token_id, lambda s: tokenizer.encode(s, add_special_tokens=False)
    prompt = enc("12+3=")
    obs = enc("=7 ")
    # 1 prompt x 2 samples; row 0: three turns; row 1 ends its second turn on EOS but the environment goes on
    sampler = Scripted([[enc("1") + [eos], enc("22")], [enc("3"), enc("4") + [eos]], [enc("55") + [eos], enc("6")]], eos, group_size=2)
    agent = _agent(Echo(), tokenizer, sampler, max_turns=3)
    batch, metrics = agent.generate(sampler, prompts(torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long), [{"answer": "15"}]), None)

    rows = [enc("1") + [eos] + obs + enc("3") + obs + enc("55") + [eos], enc("22") + obs + enc("4") + [eos] + obs + enc("6")]
    for i, row in enumerate(rows):
        assert batch.response_ids[i, : len(row)].tolist() == row  # the sampled ids, never re-tokenised
    assert batch.response_mask.sum(-1).tolist() == [len(r) for r in rows]
    assert batch.action_mask[0].tolist() == [1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1]
    assert batch.action_mask[1, : len(rows[1])].tolist() == [1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1]
    # the environment's reward for turn 1 on its last token; nothing elsewhere
    assert batch.env_rewards.nonzero().tolist() == [[0, 1], [1, 1]] and batch.env_rewards[0, 1] == 0.5
    # sampler log-probs on the model's tokens, 0 on observations
    assert batch.rollout_logprobs[0].tolist()[:6] == pytest.approx([-0.01, -0.02, 0, 0, 0, -0.01])
    assert batch.truncated.tolist() == [False, True]  # row 1's last turn hit no EOS
    assert batch.group_ids.tolist() == [0, 0] and batch.versions.tolist() == [3, 3]
    # each later turn continued from the whole context, one sample per context
    assert sampler.contexts[1] == [prompt + enc("1") + [eos] + obs, prompt + enc("22") + obs]
    assert sampler.params == SamplingParams(group_size=2, max_new_tokens=64)  # the episodes passed their settings, never set them
    assert batch.columns["completions"] == ["55", "6"] and batch.columns["answer"] == ["15", "15"]
    assert batch.columns["transcripts"][0] == "1[[env: =7 ]]3[[env: =7 ]]55"
    assert metrics["agent/turns_mean"] == 3 and metrics["agent/tool_calls_mean"] == 2 and metrics["agent/observation_tokens_mean"] == 6
    assert metrics["agent/max_turns_frac"] == 0 and metrics["tool/error_frac"] == 0


def test_max_turns_and_max_total_tokens_truncate_and_flag(tokenizer):
    eos, enc = tokenizer.eos_token_id, lambda s: tokenizer.encode(s, add_special_tokens=False)
    prompt = torch.tensor([enc("1+1=")])
    mask = torch.ones_like(prompt)
    # max_turns 2 with an environment that never finishes: the episode ends after turn 2, flagged
    sampler = Scripted([[enc("1"), enc("2")], [enc("3"), enc("4")]], eos, group_size=2)
    agent = _agent(Echo(turns=10), tokenizer, sampler, max_turns=2)
    batch, metrics = agent.generate(sampler, prompts(prompt, mask, [{}]), None)
    assert batch.truncated.tolist() == [True, True] and metrics["agent/max_turns_frac"] == 1
    assert batch.response_ids[0].tolist() == enc("1=7 3")  # no observation after the last turn
    # max_total_tokens 6: turn 1 (2) + observation (3) leave 1 token; turn 2 is cut to it
    sampler = Scripted([[enc("12")], [enc("345") + [eos]]], eos)
    agent = _agent(Echo(turns=10), tokenizer, sampler, max_turns=5, max_total_tokens=6)
    batch, _ = agent.generate(sampler, prompts(prompt, mask, [{}]), None)
    assert batch.response_ids.tolist() == [enc("12=7 3")] and batch.truncated.tolist() == [True]
    assert batch.action_mask.tolist() == [[1, 1, 0, 0, 0, 1]]
    # the sampler was asked for no more than the room left (6, then 1): no context passes prompt + max_total_tokens
    assert sampler.budgets == [6, 1] and sampler.params.max_new_tokens == 64
    # an observation longer than the remaining budget ends the episode, flagged, without it
    sampler = Scripted([[enc("12")]], eos)
    agent = _agent(Echo(observation="=" * 10, turns=10), tokenizer, sampler, max_turns=5, max_total_tokens=8)
    batch, metrics = agent.generate(sampler, prompts(prompt, mask, [{}]), None)
    assert batch.response_ids.tolist() == [enc("12")] and batch.truncated.tolist() == [True]
    assert metrics["agent/max_turns_frac"] == 0


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


def test_cancel_ends_the_episodes_of_a_generate_under_way(tokenizer):
    """An asynchronous run's teardown cancels the round sampling ahead: the step under way is released (the environment is
    closed), and every episode ends at its next turn, flagged truncated, without the environment."""
    eos, enc = tokenizer.eos_token_id, lambda s: tokenizer.encode(s, add_special_tokens=False)
    sampler = Scripted([[enc("1"), enc("2")], [enc("3")]], eos, group_size=2)
    env = Blocking()
    agent = _agent(env, tokenizer, sampler, max_turns=5)
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


class Wrong(Environment):
    def __init__(self, answer):
        self.answer = answer

    def step(self, state, turn):
        return self.answer


@pytest.mark.parametrize(
    "answer, message",
    [
        (("=7", None, False), r"Wrong.step returned a tuple; it must return components.env.Step"),
        (Step(None, None, False), r"observation=None with done=False"),
        (Step("x", float("nan"), False), r"reward=nan; it must be a finite number"),
        (Step("x", None, 1), r"done=1; it must be True or False"),
        (Step([1, 2, 99999], None, False), r"token ids outside the vocabulary"),
        (Step("caf\udcff", None, False), r"Wrong.step returned an observation that is not valid text \(surrogates not allowed at character 3"),
        (Step("x", None, False, "many", 0), r"Wrong.step returned tool_calls='many', tool_errors=0; they must be integers"),
        (Step("x", None, False, -5, 7), r"Wrong.step returned tool_calls=-5, tool_errors=7; they must be integers with 0 <= tool_errors <= tool_calls"),
        (Step("x", None, False, 1, 2), r"tool_calls=1, tool_errors=2"),
    ],
)
def test_a_misbehaving_environment_fails_with_one_clear_error(tokenizer, answer, message):
    sampler = Scripted([[[5, 6]]], tokenizer.eos_token_id)
    agent = _agent(Wrong(answer), tokenizer, sampler)
    with pytest.raises((TypeError, ValueError), match=message):
        agent.generate(sampler, prompts(torch.tensor([[7, 8]]), torch.ones(1, 2, dtype=torch.long), [{}]), None)


def test_setup_errors(tokenizer):
    from components.env import Calculator, ToolEnvironment

    sampler = Scripted([], tokenizer.eos_token_id)
    with pytest.warns(UserWarning, match=r"stop text '</call>' is 7 tokens"):
        assert _agent(ToolEnvironment([Calculator()]), tokenizer, sampler).stop_ids == []
    with pytest.raises(ValueError, match="has no chat template"):
        _agent(Echo(), tokenizer, sampler, chat_template=True)
    sampler.params = replace(sampler.params, greedy_baseline=True)
    with pytest.raises(ValueError, match="greedy_baseline: false"):
        _agent(Echo(), tokenizer, sampler)


def _trainer_sampler_gap(policy, batch, temperature) -> float:
    trainer = policy_logprobs(policy, batch, temperature)[0].detach()
    gap = float(((trainer - batch.rollout_logprobs).abs() * batch.loss_mask).max())
    return gap


def _three_turns(agent, sampler, policy, tokenizer):
    enc = tokenizer(["12+3=", "4*5="], return_tensors="pt", padding=True)
    batch, metrics = agent.generate(sampler, prompts(enc.input_ids, enc.attention_mask, [{}, {}]), policy)
    assert metrics["agent/turns_mean"] == 3
    assert (batch.response_mask * (1 - batch.action_mask)).sum(-1).tolist() == [6] * batch.batch_size  # two observations each
    return batch


def test_trainer_logprobs_equal_the_hf_samplers_over_three_turns(tiny_model_path, tokenizer):
    policy = load_causal_lm(ModelSpec(path=tiny_model_path))
    sampler = HFRollout(group_size=2, max_new_tokens=5, temperature=0.8, return_logprobs=True)
    sampler.setup(tokenizer)
    torch.manual_seed(0)
    batch = _three_turns(_agent(Echo(), tokenizer, sampler, max_total_tokens=40), sampler, policy, tokenizer)
    assert _trainer_sampler_gap(policy, batch, 0.8) < 1e-5
    assert _trainer_sampler_gap(policy, batch, 1.0) > 1e-2  # a test that can fail: the wrong temperature is far off


@pytest.mark.slow
def test_trainer_logprobs_equal_the_sglang_servers_over_three_turns(tiny_model_path, tokenizer):
    from tests.fixtures.sglang_server import FakeSGLangServer

    server = FakeSGLangServer(tiny_model_path).start()
    sampler = SGLangRollout(base_url=server.url, group_size=2, max_new_tokens=5, temperature=0.8, backoff=0.01, verify_every=0)  # requests counted below
    try:
        sampler.setup(tokenizer)
        policy = load_causal_lm(ModelSpec(path=tiny_model_path))
        batch = _three_turns(_agent(Echo(), tokenizer, sampler, max_total_tokens=40), sampler, policy, tokenizer)
        # turn 1: one request per prompt with n = 2; turns 2 and 3: one request per episode with its whole context
        assert [c["sampling_params"]["n"] for c in server.generate_calls] == [2, 2] + [1] * 8
        assert _trainer_sampler_gap(policy, batch, 0.8) < 1e-5
    finally:
        sampler.close()
        server.stop()


def test_episode_metrics_by_hand():
    from components.rollout.episode import Episode, episode_metrics

    # episode 1: two turns, 3 calls of which 1 failed, a 4-token observation; episode 2: one turn, no call, cut at max_turns
    first, second = Episode([1], None), Episode([1], None)
    first.add([5, 6], 1, None), first.add([7, 8, 9, 10], 0, None), first.add([11], 1, None)
    first.turns, first.tool_calls, first.tool_errors = 2, 3, 1
    second.add([5], 1, None)
    second.turns = 1
    second.end(truncated=True, max_turns=True)
    metrics = {k: float(v) for k, v in episode_metrics([first, second]).items()}
    assert metrics == {
        "agent/turns_mean": 1.5,
        "agent/tool_calls_mean": 1.5,
        "tool/error_frac": pytest.approx(1 / 3),  # failed calls over all calls, not over episodes
        "agent/observation_tokens_mean": 2.0,
        "agent/max_turns_frac": 0.5,
    }


def test_the_readmes_custom_environment_runs(tokenizer):
    # README "Agents and tools": the GuessTheNumber example, as printed, drives an episode
    import re
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", readme, re.DOTALL) if "class GuessTheNumber" in block]
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    eos, enc = tokenizer.eos_token_id, lambda s: tokenizer.encode(s, add_special_tokens=False)
    sampler = Scripted([[enc("5") + [eos]], [enc("9") + [eos]], [enc("7") + [eos]]], eos)
    agent = _agent(namespace["GuessTheNumber"](), tokenizer, sampler, max_turns=3)
    prompt = enc("guess:")
    batch, _ = agent.generate(sampler, prompts(torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long), [{"answer": "7"}]), None)
    higher, lower = enc(" higher: "), enc(" lower: ")  # (the tiny tokenizer knows digits and signs, not letters)
    assert batch.response_ids[0].tolist() == enc("5") + [eos] + higher + enc("9") + [eos] + lower + enc("7") + [eos]
    assert batch.columns["completions"] == ["7"] and batch.columns["transcripts"][0].count("[[env: ") == 2
    assert batch.env_rewards.nonzero()[:, 1].tolist() == [1, 3 + len(higher)]  # -0.1 on each hinted turn's EOS
    assert batch.env_rewards.sum() == pytest.approx(-0.2) and batch.truncated.tolist() == [False]


class RewardEveryTurn(Environment):
    def step(self, state, turn):
        return Step(done=True, reward=0.5) if turn.index == 1 else Step("=7 ", 0.5)


def test_a_turn_reward_never_lands_on_an_observation(tokenizer):
    # row 0's second turn came back empty (a sampler at its context limit): its reward joins turn 1's on the model's
    # last token, not the observation's last token
    eos, enc = tokenizer.eos_token_id, lambda s: tokenizer.encode(s, add_special_tokens=False)
    sampler = Scripted([[enc("1"), enc("2")], [[], enc("3")]], eos, group_size=2)
    agent = _agent(RewardEveryTurn(), tokenizer, sampler)
    batch, _ = agent.generate(sampler, prompts(torch.tensor([enc("1+1=")]), torch.ones(1, 4, dtype=torch.long), [{}]), None)
    n = 1 + len(enc("=7 "))
    assert batch.response_mask.sum(-1).tolist() == [n, n + 1]
    assert batch.env_rewards.tolist() == [[1.0] + [0.0] * n, [0.5] + [0.0] * (n - 1) + [0.5]]


def test_every_rank_takes_as_many_turns_as_the_busiest(tokenizer, monkeypatch):
    # this rank's episode ends after turn 1 while another rank's stays open for two more turns: this rank keeps
    # calling the sampler (a sharded policy's forward is a collective) with a stand-in turn that changes nothing
    import components.rollout.multi_turn as multi_turn

    eos, enc = tokenizer.eos_token_id, lambda s: tokenizer.encode(s, add_special_tokens=False)
    prompt = torch.tensor([enc("1+1=")])
    alone = Scripted([[enc("2") + [eos]]], eos)
    expected, _ = _agent(Echo(turns=1), tokenizer, alone).generate(alone, prompts(prompt, torch.ones_like(prompt), [{}]), None)
    other_rank_open = iter([1.0, 1.0, 0.0])
    monkeypatch.setattr(multi_turn, "all_reduce_sum", lambda x: x + next(other_rank_open))
    sampler = Scripted([[enc("2") + [eos]], [enc("99")], [enc("98")]], eos)
    batch, _ = _agent(Echo(turns=1), tokenizer, sampler).generate(sampler, prompts(prompt, torch.ones_like(prompt), [{}]), None)
    assert len(sampler.contexts) == 3 and sampler.contexts[1] == [enc("1+1=2") + [eos]]  # the finished episode, as a stand-in
    assert batch.response_ids.tolist() == expected.response_ids.tolist() == [enc("2") + [eos]] and batch.columns["completions"] == ["2"]


def test_episodes_pass_their_settings_and_never_change_the_samplers(tokenizer):
    # In asynchronous training an agent's episodes run on the rollout thread while the trainer's thread reads the
    # rollout's settings (e.g. group_size for sampling/zero_var_groups): the later turns' one-sample, stop-token and
    # budget settings must travel with each call, never through the shared sampler.
    seen = []

    class Watched(Scripted):
        def generate(self, prompts, policy, params=None):
            seen.append((self.params, params))  # what another thread reads now, and what this call samples with
            return super().generate(prompts, policy, params)

    eos, enc = tokenizer.eos_token_id, lambda s: tokenizer.encode(s, add_special_tokens=False)
    sampler = Watched([[enc("1"), enc("2")], [enc("3"), enc("4")], [enc("5") + [eos], enc("6") + [eos]]], eos, group_size=2)
    configured = sampler.params
    agent = _agent(Echo(), tokenizer, sampler, max_turns=3, max_total_tokens=20)
    agent.generate(sampler, prompts([enc("1+1=")]), None)
    assert [shared for shared, _ in seen] == [configured] * 3
    assert [(p.group_size, p.max_new_tokens) for _, p in seen] == [(2, 20), (1, 16), (1, 12)]  # the room each turn had left
    with pytest.raises(AttributeError):
        configured.group_size = 1  # a frozen value: nobody can change it in place
