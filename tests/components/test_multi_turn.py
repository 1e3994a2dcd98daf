"""MultiTurnRollout: transcripts built from the exact sampled ids, environment tokens marked, budgets that truncate
and flag, clear errors for a misbehaving environment, and trainer log-probs equal to the sampler's on HF and SGLang."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from components.rollout import HFRollout, SGLangRollout
from components.rollout.server.settings import Servers, Verification
from lightning_rl.core.contracts import Environment, Step
from lightning_rl.core.logprobs import policy_logprobs
from lightning_rl.core.models import ModelSpec, load_causal_lm
from lightning_rl.core.sampling_params import SamplingParams
from tests.helpers import prompts
from tests.support.multi_turn import (
    Blocking,
    Echo,
    Scripted,
    check_cancel_ends_the_episodes_of_a_generate_under_way,
    make_agent,
)


def test_transcript_layout_masks_rewards_and_contexts(tokenizer):
    eos, enc = tokenizer.eos_token_id, lambda s: tokenizer.encode(s, add_special_tokens=False)
    prompt = enc("12+3=")
    obs = enc("=7 ")
    # 1 prompt x 2 samples; row 0: three turns; row 1 ends its second turn on EOS but the environment goes on
    sampler = Scripted(
        [[enc("1") + [eos], enc("22")], [enc("3"), enc("4") + [eos]], [enc("55") + [eos], enc("6")]], eos, group_size=2
    )
    agent = make_agent(Echo(), tokenizer, sampler, max_turns=3)
    batch, metrics = agent.generate(
        sampler, prompts(torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long), [{"answer": "15"}]), None
    )

    rows = [
        enc("1") + [eos] + obs + enc("3") + obs + enc("55") + [eos],
        enc("22") + obs + enc("4") + [eos] + obs + enc("6"),
    ]
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
    assert sampler.params == SamplingParams(
        group_size=2, max_new_tokens=64
    )  # the episodes passed their settings, never set them
    assert batch.columns["completions"] == ["55", "6"] and batch.columns["answer"] == ["15", "15"]
    assert batch.columns["transcripts"][0] == "1[[env: =7 ]]3[[env: =7 ]]55"
    assert (
        metrics["agent/turns_mean"] == 3
        and metrics["agent/tool_calls_mean"] == 2
        and metrics["agent/observation_tokens_mean"] == 6
    )
    assert metrics["agent/max_turns_frac"] == 0 and metrics["tool/error_frac"] == 0


def test_max_turns_and_max_total_tokens_truncate_and_flag(tokenizer):
    eos, enc = tokenizer.eos_token_id, lambda s: tokenizer.encode(s, add_special_tokens=False)
    prompt = torch.tensor([enc("1+1=")])
    mask = torch.ones_like(prompt)
    # max_turns 2 with an environment that never finishes: the episode ends after turn 2, flagged
    sampler = Scripted([[enc("1"), enc("2")], [enc("3"), enc("4")]], eos, group_size=2)
    agent = make_agent(Echo(turns=10), tokenizer, sampler, max_turns=2)
    batch, metrics = agent.generate(sampler, prompts(prompt, mask, [{}]), None)
    assert batch.truncated.tolist() == [True, True] and metrics["agent/max_turns_frac"] == 1
    assert batch.response_ids[0].tolist() == enc("1=7 3")  # no observation after the last turn
    # max_total_tokens 6: turn 1 (2) + observation (3) leave 1 token; turn 2 is cut to it
    sampler = Scripted([[enc("12")], [enc("345") + [eos]]], eos)
    agent = make_agent(Echo(turns=10), tokenizer, sampler, max_turns=5, max_total_tokens=6)
    batch, _ = agent.generate(sampler, prompts(prompt, mask, [{}]), None)
    assert batch.response_ids.tolist() == [enc("12=7 3")] and batch.truncated.tolist() == [True]
    assert batch.action_mask.tolist() == [[1, 1, 0, 0, 0, 1]]
    # the sampler was asked for no more than the room left (6, then 1): no context passes prompt + max_total_tokens
    assert sampler.budgets == [6, 1] and sampler.params.max_new_tokens == 64
    # an observation longer than the remaining budget ends the episode, flagged, without it
    sampler = Scripted([[enc("12")]], eos)
    agent = make_agent(Echo(observation="=" * 10, turns=10), tokenizer, sampler, max_turns=5, max_total_tokens=8)
    batch, metrics = agent.generate(sampler, prompts(prompt, mask, [{}]), None)
    assert batch.response_ids.tolist() == [enc("12")] and batch.truncated.tolist() == [True]
    assert metrics["agent/max_turns_frac"] == 0


def test_without_max_total_tokens_an_episode_fills_the_policys_context_after_its_prompt(tokenizer):
    """max_total_tokens unset: each episode holds up to the policy's positions less its own prompt, and no sampler
    call asks for a position past them (the longest context bounds a batched call)."""
    from types import SimpleNamespace

    eos, enc = tokenizer.eos_token_id, lambda s: tokenizer.encode(s, add_special_tokens=False)
    policy = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=12))
    short, long = enc("1+1="), enc("11+11=")  # 4 and 6 prompt tokens: 8 and 6 response tokens fit
    ids = torch.tensor([[0, 0] + short, long])
    mask = torch.tensor([[0, 0] + [1] * 4, [1] * 6])
    # turn 1: 2 tokens each, observation 3; turn 2 asks for the room of the longest context: 12 - (6 + 5) = 1
    sampler = Scripted([[enc("12"), enc("34")], [enc("5678"), enc("9")]], eos)
    agent = make_agent(Echo(turns=10), tokenizer, sampler, max_turns=5, max_total_tokens=None)
    batch, _ = agent.generate(sampler, prompts(ids, mask, [{}, {}]), policy)
    assert sampler.budgets == [6, 1]  # 12 - 6 (the longer prompt), then 12 - 11
    lengths = batch.response_mask.sum(-1).tolist()
    assert lengths == [6, 6] and batch.truncated.tolist() == [True, True]
    assert all(p + r <= 12 for p, r in zip([4, 6], lengths))  # prompt + response within the positions
    with pytest.raises(ValueError, match="policy's config gives no max_position_embeddings: set model.agent"):
        make_agent(Echo(), tokenizer, sampler, max_total_tokens=None).generate(
            sampler, prompts(ids, mask, [{}, {}]), None
        )


def test_cancel_ends_the_episodes_of_a_generate_under_way(tokenizer):
    """An asynchronous run's teardown cancels the round sampling ahead: the step under way is released (the environment is
    closed), and every episode ends at its next turn, flagged truncated, without the environment."""
    check_cancel_ends_the_episodes_of_a_generate_under_way(tokenizer)


def test_a_cancel_while_the_first_turn_samples_ends_the_episodes_without_the_environment(tokenizer):
    """A round interrupted during its first turn's sampling (a round sampled ahead starts with it): cancel() already
    knows the call, so every episode ends after that turn and no tool runs."""
    import threading

    eos, enc = tokenizer.eos_token_id, lambda s: tokenizer.encode(s, add_special_tokens=False)

    class Held(Scripted):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.sampling, self.release = threading.Event(), threading.Event()

        def generate(self, prompts, policy, params=None):
            self.sampling.set()
            assert self.release.wait(10.0)
            return super().generate(prompts, policy, params)

    sampler = Held([[enc("1"), enc("2")], [enc("3"), enc("4")]], eos, group_size=2)
    env = Blocking()
    agent = make_agent(env, tokenizer, sampler, max_turns=2)
    result = []
    thread = threading.Thread(
        target=lambda: result.append(agent.generate(sampler, prompts(torch.tensor([enc("1+1=")])), None)), daemon=True
    )
    thread.start()
    assert sampler.sampling.wait(10.0)
    agent.cancel()
    sampler.release.set()
    thread.join(10.0)
    batch, _ = result[0]
    assert env.steps == 0 and batch.truncated.tolist() == [True, True] and len(sampler.contexts) == 1
    assert agent._running == set() and agent._cancelled == set()


class Wrong(Environment):
    def __init__(self, answer):
        self.answer = answer

    def step(self, state, turn):
        return self.answer


@pytest.mark.parametrize(
    "answer, message",
    [
        (("=7", None, False), r"Wrong.step returned a tuple; it must return lightning_rl.core.contracts.Step"),
        (Step(None, None, False), r"observation=None with done=False"),
        (Step("x", float("nan"), False), r"reward=nan; it must be a finite number"),
        (Step("x", None, 1), r"done=1; it must be True or False"),
        (Step([1, 2, 99999], None, False), r"token ids outside the vocabulary"),
        (
            Step("caf\udcff", None, False),
            r"Wrong.step returned an observation that is not valid text \(surrogates not allowed at character 3",
        ),
        (
            Step("x", None, False, "many", 0),
            r"Wrong.step returned tool_calls='many', tool_errors=0; they must be integers",
        ),
        (
            Step("x", None, False, -5, 7),
            r"Wrong.step returned tool_calls=-5, tool_errors=7; they must be integers with 0 <= tool_errors <= tool_calls",
        ),
        (Step("x", None, False, 1, 2), r"tool_calls=1, tool_errors=2"),
    ],
)
def test_a_misbehaving_environment_fails_with_one_clear_error(tokenizer, answer, message):
    sampler = Scripted([[[5, 6]]], tokenizer.eos_token_id)
    agent = make_agent(Wrong(answer), tokenizer, sampler)
    with pytest.raises((TypeError, ValueError), match=message):
        agent.generate(sampler, prompts(torch.tensor([[7, 8]]), torch.ones(1, 2, dtype=torch.long), [{}]), None)


def test_setup_errors(tokenizer):
    from components.env import Calculator, ToolEnvironment

    sampler = Scripted([], tokenizer.eos_token_id)
    with pytest.warns(UserWarning, match=r"stop text '</call>' is 7 tokens"):
        assert make_agent(ToolEnvironment([Calculator()]), tokenizer, sampler).stop_ids == []
    with pytest.raises(ValueError, match="has no chat template"):
        make_agent(Echo(), tokenizer, sampler, chat_template=True)
    sampler.params = replace(sampler.params, greedy_baseline=True)
    with pytest.raises(ValueError, match="greedy_baseline: false"):
        make_agent(Echo(), tokenizer, sampler)


def _trainer_sampler_gap(policy, batch, temperature) -> float:
    trainer = policy_logprobs(policy, batch, temperature)[0].detach()
    gap = float(((trainer - batch.rollout_logprobs).abs() * batch.loss_mask).max())
    return gap


def _three_turns(agent, sampler, policy, tokenizer):
    enc = tokenizer(["12+3=", "4*5="], return_tensors="pt", padding=True)
    batch, metrics = agent.generate(sampler, prompts(enc.input_ids, enc.attention_mask, [{}, {}]), policy)
    assert metrics["agent/turns_mean"] == 3
    assert (batch.response_mask * (1 - batch.action_mask)).sum(-1).tolist() == [
        6
    ] * batch.batch_size  # two observations each
    return batch


def test_trainer_logprobs_equal_the_hf_samplers_over_three_turns(tiny_model_path, tokenizer):
    policy = load_causal_lm(ModelSpec(path=tiny_model_path))
    sampler = HFRollout(group_size=2, max_new_tokens=5, temperature=0.8, return_logprobs=True)
    sampler.setup(tokenizer)
    torch.manual_seed(0)
    batch = _three_turns(make_agent(Echo(), tokenizer, sampler, max_total_tokens=40), sampler, policy, tokenizer)
    assert _trainer_sampler_gap(policy, batch, 0.8) < 1e-5
    assert _trainer_sampler_gap(policy, batch, 1.0) > 1e-2  # a test that can fail: the wrong temperature is far off


@pytest.mark.slow
@pytest.mark.server
def test_trainer_logprobs_equal_the_sglang_servers_over_three_turns(tiny_model_path, tokenizer):
    from tests.fixtures.sglang_server import FakeSGLangServer

    server = FakeSGLangServer(tiny_model_path).start()
    sampler = SGLangRollout(
        group_size=2,
        max_new_tokens=5,
        temperature=0.8,
        servers=Servers(urls=(server.url,), backoff=0.01),
        verify=Verification(every=0),
    )  # requests counted below
    try:
        sampler.setup(tokenizer)
        policy = load_causal_lm(ModelSpec(path=tiny_model_path))
        batch = _three_turns(make_agent(Echo(), tokenizer, sampler, max_total_tokens=40), sampler, policy, tokenizer)
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


def test_the_docs_custom_environment_runs(tokenizer):
    # docs/agents.md, "Multi-turn episodes": the GuessTheNumber example, as printed, drives an episode
    import re
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "agents.md").read_text()
    (code,) = [
        block for block in re.findall(r"```python\n(.*?)```", page, re.DOTALL) if "class GuessTheNumber" in block
    ]
    namespace: dict = {}
    exec(compile(code, "docs/agents.md", "exec"), namespace)
    eos, enc = tokenizer.eos_token_id, lambda s: tokenizer.encode(s, add_special_tokens=False)
    sampler = Scripted([[enc("5") + [eos]], [enc("9") + [eos]], [enc("7") + [eos]]], eos)
    agent = make_agent(namespace["GuessTheNumber"](), tokenizer, sampler, max_turns=3)
    prompt = enc("guess:")
    batch, _ = agent.generate(
        sampler, prompts(torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long), [{"answer": "7"}]), None
    )
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
    agent = make_agent(RewardEveryTurn(), tokenizer, sampler)
    batch, _ = agent.generate(
        sampler, prompts(torch.tensor([enc("1+1=")]), torch.ones(1, 4, dtype=torch.long), [{}]), None
    )
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
    expected, _ = make_agent(Echo(turns=1), tokenizer, alone).generate(
        alone, prompts(prompt, torch.ones_like(prompt), [{}]), None
    )
    other_rank_open = iter([1.0, 1.0, 0.0])
    monkeypatch.setattr(multi_turn, "all_reduce_sum", lambda x: x + next(other_rank_open))
    sampler = Scripted([[enc("2") + [eos]], [enc("99")], [enc("98")]], eos)
    batch, _ = make_agent(Echo(turns=1), tokenizer, sampler).generate(
        sampler, prompts(prompt, torch.ones_like(prompt), [{}]), None
    )
    assert len(sampler.contexts) == 3 and sampler.contexts[1] == [
        enc("1+1=2") + [eos]
    ]  # the finished episode, as a stand-in
    assert batch.response_ids.tolist() == expected.response_ids.tolist() == [enc("2") + [eos]] and batch.columns[
        "completions"
    ] == ["2"]


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
    sampler = Watched(
        [[enc("1"), enc("2")], [enc("3"), enc("4")], [enc("5") + [eos], enc("6") + [eos]]], eos, group_size=2
    )
    configured = sampler.params
    agent = make_agent(Echo(), tokenizer, sampler, max_turns=3, max_total_tokens=20)
    agent.generate(sampler, prompts([enc("1+1=")]), None)
    assert [shared for shared, _ in seen] == [configured] * 3
    assert [(p.group_size, p.max_new_tokens) for _, p in seen] == [
        (2, 20),
        (1, 16),
        (1, 12),
    ]  # the room each turn had left
    with pytest.raises(AttributeError):
        configured.group_size = 1  # a frozen value: nobody can change it in place


class _Waiting:
    """A tool that waits 0.3 s and answers its argument, counting how many calls run at once."""

    name = "wait"

    def __init__(self):
        import threading

        self.lock, self.running, self.peak = threading.Lock(), 0, 0

    def __call__(self, arguments: str) -> str:
        import time

        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(0.3)
        with self.lock:
            self.running -= 1
        return arguments

    def close(self) -> None:
        pass


class _AskEachRowsKey(Environment):
    """One tool call per episode with its row's key; the answer is the observation; the next turn ends it."""

    def __init__(self, tool):
        self.tool = tool

    def reset(self, row):
        return {"key": row["key"]}

    def step(self, state, turn):
        if turn.index == 0:
            return Step(f"={self.tool(state['key'])}=", None, False, 1, 0)
        return Step(done=True)


@pytest.mark.parametrize("max_concurrent_tools", [1, 8])
def test_the_tool_calls_of_a_turn_run_concurrently_each_answer_to_its_episode(tokenizer, max_concurrent_tools):
    import time

    eos, enc = tokenizer.eos_token_id, lambda s: tokenizer.encode(s, add_special_tokens=False)
    keys = [str(100 + i) for i in range(16)]
    sampler = Scripted([[enc("1")] * 16, [enc("2")] * 16], eos, group_size=1)
    tool = _Waiting()
    agent = make_agent(_AskEachRowsKey(tool), tokenizer, sampler, max_concurrent_tools=max_concurrent_tools)
    start = time.monotonic()
    try:
        batch, _ = agent.generate(
            sampler, prompts(torch.tensor([enc("1+1=")] * 16), None, [{"key": k} for k in keys]), None
        )
    finally:
        agent.close()
    elapsed = time.monotonic() - start
    assert tool.peak == max_concurrent_tools
    if max_concurrent_tools == 8:
        assert elapsed < 2.4  # two waves of 0.3 s; one after another: 16 x 0.3 = 4.8 s
    else:
        assert elapsed > 4.7
    for i, key in enumerate(keys):
        n = int(batch.response_mask[i].sum())
        assert batch.response_ids[i, :n].tolist() == enc("1") + enc(f"={key}=") + enc("2")
