"""OpenAIAgent's exact tokens across turns (TITO) on three chat-template families (tests/fixtures/chat_templates.py):
every call's prompt is the row's recorded ids plus the new messages' tokens, the trained ids are the sampled ids, the
added messages are masked, a template that drops earlier reasoning cannot change them, an agent that rewrites its
history starts a new row (counted), and the trainer's log-probs equal the sampler's over three turns."""

from __future__ import annotations

import pytest
import torch

from components.rollout import HFRollout, OpenAIAgent
from components.rollout.chat_turns import template_message
from components.rollout.endpoint import HermesToolCalls, JsonToolCalls
from lightning_rl.core.logprobs import policy_logprobs
from tests.fixtures.chat_templates import family_tokenizer
from tests.helpers import prompts
from tests.support.openai import TOOL_RESULT, ScriptedChat

pytestmark = pytest.mark.server  # the agents' endpoint listens on a port

CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "add",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
PARSERS = {
    "chatml": HermesToolCalls,
    "llama3": JsonToolCalls,
    "thinking": HermesToolCalls,
    "deep_hermes": HermesToolCalls,
    "deep_json": JsonToolCalls,
}


def _calls(response) -> dict:
    return {"prompt": response.prompt_token_ids, "sampled": response.choices[0].token_ids}


def tool_agent(client, row):
    """A plain OpenAI tool loop: the assistant message is sent back as it came, each call answered with "3"."""
    messages, calls = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": row["prompt"]}], []
    for _ in range(4):
        response = client.chat.completions.create(model="policy", messages=messages, tools=[CALC])
        calls.append(_calls(response))
        message = response.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            return {
                "answer": message.content,
                "calls": calls,
                "messages": [m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in messages],
            }
        messages += [{"role": "tool", "tool_call_id": call.id, "content": "3"} for call in message.tool_calls]
    raise AssertionError("the script has three turns")


def reasoning_dropping_agent(client, row):
    """Sends each assistant turn back without its <think> block, as many agent loops do: the history is rewritten."""
    messages, calls = [{"role": "user", "content": row["prompt"]}], []
    for _ in range(4):
        response = client.chat.completions.create(model="policy", messages=messages, tools=[CALC])
        calls.append(_calls(response))
        message = response.choices[0].message
        if not message.tool_calls:
            return {"answer": message.content, "calls": calls}
        messages.append(
            {
                "role": "assistant",
                "content": message.content.split("</think>")[-1].strip(),
                "tool_calls": [c.model_dump() for c in message.tool_calls],
            }
        )
        messages += [{"role": "tool", "tool_call_id": call.id, "content": "3"} for call in message.tool_calls]
    raise AssertionError("the script has three turns")


def three_turn_agent(client, row):
    """Three calls whatever the (random) model says, a tool result after each of the first two."""
    messages, calls = [{"role": "user", "content": row["prompt"]}], []
    for turn in range(3):
        response = client.chat.completions.create(model="policy", messages=messages, tools=[CALC])
        calls.append(_calls(response))
        messages.append(response.choices[0].message)
        if turn < 2:
            messages.append({"role": "tool", "tool_call_id": "call_0", "content": "3"})
    return {"answer": response.choices[0].message.content, "calls": calls}


def _agent(function: str, tokenizer, sampler, family: str, **kwargs) -> OpenAIAgent:
    kwargs.setdefault("max_total_tokens", 1024)  # most run without a policy: no context to derive it from
    agent = OpenAIAgent(f"{__name__}.{function}", tool_calls=PARSERS[family](), timeout_s=60, **kwargs)
    sampler.setup(tokenizer)
    agent.setup(tokenizer, sampler)
    return agent


def _run(agent, sampler, tokenizer, policy=None, n_prompts: int = 2):
    rows = [{"prompt": f"{i}+2?"} for i in range(n_prompts)]
    ids = [tokenizer.encode(r["prompt"], add_special_tokens=False) for r in rows]
    try:
        return agent.generate(sampler, prompts(ids, None, rows), policy)
    finally:
        agent.close()


def _row_tokens(batch, i) -> tuple[list[int], list[int], list[int]]:
    """Row ``i``: its prompt, its response ids and their action flags."""
    prompt = batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist()
    n = int(batch.response_mask[i].sum())
    return prompt, batch.response_ids[i, :n].tolist(), batch.action_mask[i, :n].tolist()


@pytest.mark.parametrize("family", ["chatml", "llama3", "thinking"])
def test_each_call_continues_the_recorded_ids_and_the_row_trains_exactly_the_sampled_ones(family):
    tokenizer = family_tokenizer(family)
    sampler = ScriptedChat(tokenizer, family, group_size=2)
    # the thinking family answers its reasoning apart (reasoning_content), which the agent sends back with the message
    reasoning = {"reasoning_tags": ["<think>", "</think>"]} if family == "thinking" else {}
    batch, metrics = _run(_agent("tool_agent", tokenizer, sampler, family, **reasoning), sampler, tokenizer)
    assert (
        batch.batch_size == 4 and float(metrics["agent/prefix_breaks"]) == 0 and float(metrics["agent/turns_mean"]) == 3
    )
    assert float(metrics["agent/tool_calls_mean"]) == 2
    for i in range(batch.batch_size):
        result = batch.columns["result"][i]
        assert result["answer"] == "3" and batch.columns["completions"][i] == "3"
        prompt, response, action = _row_tokens(batch, i)
        assert prompt == result["calls"][0]["prompt"]
        # every call's prompt is exactly the row so far: nothing already sampled was rendered or tokenised again
        for call in result["calls"]:
            assert (prompt + response)[: len(call["prompt"])] == call["prompt"]
        sampled = [t for t, a in zip(response, action) if a]
        assert sampled == [t for call in result["calls"] for t in call["sampled"]]  # trained ids == sampled ids
        added = [t for t, a in zip(response, action) if not a]  # the tool results and headers: masked
        assert "3" in tokenizer.decode(added) and TOOL_RESULT[family] in tokenizer.decode(
            added, skip_special_tokens=False
        )
        assert torch.allclose(batch.rollout_logprobs[i][batch.action_mask[i].bool()], torch.tensor(-0.1))
        messages = [
            template_message(m) for m in result["messages"]
        ]  # call arguments as mappings, as templates read them
        rendered = tokenizer.encode(
            tokenizer.apply_chat_template(messages, tools=[CALC], tokenize=False), add_special_tokens=False
        )
        if (
            family == "thinking"
        ):  # the template drops the first turns' <think> blocks: a re-render is not what was sampled
            assert rendered[: len(prompt + response)] != prompt + response
            assert tokenizer.decode(response).count("<think>") == 3
        else:  # an append-only template: the appended ids are those of a full render
            assert rendered[: len(prompt + response)] == prompt + response


def test_an_agent_that_drops_its_reasoning_starts_a_new_row_at_each_rewrite_and_counts_it():
    tokenizer = family_tokenizer("thinking")
    sampler = ScriptedChat(tokenizer, "thinking", group_size=1)
    batch, metrics = _run(
        _agent("reasoning_dropping_agent", tokenizer, sampler, "thinking"), sampler, tokenizer, n_prompts=2
    )
    assert float(metrics["agent/prefix_breaks"]) == 4  # two rewrites per episode
    assert batch.batch_size == 6 and batch.group_ids.tolist() == [
        0,
        0,
        0,
        1,
        1,
        1,
    ]  # three rows per episode, groups of one episode
    for episode in range(2):
        calls = batch.columns["result"][3 * episode]["calls"]
        for k, call in enumerate(calls):  # each row: one call's full render, then its sampled turn
            prompt, response, action = _row_tokens(batch, 3 * episode + k)
            assert prompt == call["prompt"] and response == call["sampled"] and all(action)
            assert "<think>" not in tokenizer.decode(prompt)  # the rewritten history, rendered as the agent sent it


def test_rows_are_padded_so_every_episode_has_as_many_and_groups_stay_equal():
    tokenizer = family_tokenizer("thinking")
    sampler = ScriptedChat(tokenizer, "thinking", group_size=2)
    agent = _agent("reasoning_dropping_agent", tokenizer, sampler, "thinking")
    agent.function = lambda client, row: (
        tool_agent(client, row) if row["prompt"].startswith("0") else reasoning_dropping_agent(client, row)
    )
    batch, metrics = _run(agent, sampler, tokenizer)
    assert batch.batch_size == 12 and batch.group_ids.tolist() == [0] * 6 + [1] * 6
    lengths = batch.response_mask.sum(-1).view(4, 3)  # (episode, row)
    assert (lengths[:2, 0] > 0).all() and (
        lengths[:2, 1:] == 0
    ).all()  # the unbroken episodes: one row and two empty ones
    assert (lengths[2:] > 0).all()
    assert batch.columns["result"][0] is batch.columns["result"][2]  # an episode's rows share its result


@pytest.mark.parametrize("family", ["chatml", "llama3", "thinking"])
def test_trainer_logprobs_equal_the_samplers_over_three_turns(family):
    from lightning_rl.recipes.tiny import build_tiny_llama

    tokenizer = family_tokenizer(family)
    policy = build_tiny_llama(tokenizer, hidden_size=32, layers=2, heads=2, seed=0, max_positions=1024)
    sampler = HFRollout(group_size=2, max_new_tokens=6, temperature=0.8, return_logprobs=True)
    torch.manual_seed(0)
    batch, metrics = _run(_agent("three_turn_agent", tokenizer, sampler, family), sampler, tokenizer, policy)
    assert float(metrics["agent/turns_mean"]) == 3 and float(metrics["agent/prefix_breaks"]) == 0
    assert ((batch.response_mask * (1 - batch.action_mask)).sum(-1) > 0).all()  # the tool results are in, masked
    trainer = policy_logprobs(policy, batch, 0.8)[0].detach()
    assert float(((trainer - batch.rollout_logprobs).abs() * batch.loss_mask).max()) < 1e-5
    assert (
        float(
            ((policy_logprobs(policy, batch, 1.0)[0].detach() - batch.rollout_logprobs).abs() * batch.loss_mask).max()
        )
        > 1e-2
    )


def test_the_agents_http_client_retries_a_connection_that_failed_to_open():
    """A connection refused (nothing sent) is opened again; before, the episode failed with APIConnectionError (one of
    256 episodes connecting at once did, once in a CI run)."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from components.rollout.endpoint.http_client import episode_http_client
    from components.rollout.sglang.server import free_port

    class Ok(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    port = free_port()

    def listen_late():
        time.sleep(0.2)  # the first attempt finds nothing listening
        with HTTPServer(("127.0.0.1", port), Ok) as server:
            server.handle_request()

    threading.Thread(target=listen_late, daemon=True).start()
    client = episode_http_client(asynchronous=False)
    try:
        assert client.get(f"http://127.0.0.1:{port}/").status_code == 200
    finally:
        client.close()


def test_a_round_of_many_episodes_connecting_at_once_loses_none():
    """All of a round's episodes open their connections together; the server's listen queue (socketserver's 5)
    refused some, and their agents failed with APIConnectionError (about 5% of configs/openai_agent.yaml's)."""
    tokenizer = family_tokenizer("chatml")
    sampler = ScriptedChat(tokenizer, "chatml", group_size=64)
    batch, metrics = _run(_agent("tool_agent", tokenizer, sampler, "chatml"), sampler, tokenizer, n_prompts=4)
    assert batch.batch_size == 256 and float(metrics["agent/error_frac"]) == 0, [
        e for e in batch.columns["agent_error"] if e
    ][:3]


def test_an_episodes_deadline_ends_its_sampler_call_in_flight():
    """The sampler call of a round whose episodes all passed timeout_s ends within a step; before, the round waited for
    the whole call (a 5 MB prompt's prefill ran for 10 minutes)."""
    import time

    from tests.support.openai import EndlessSampler

    tokenizer = family_tokenizer("chatml")
    sampler = EndlessSampler(tokenizer, "chatml", group_size=2, seconds=60)
    agent = OpenAIAgent(f"{__name__}.tool_agent", tool_calls=HermesToolCalls(), timeout_s=1.0, max_total_tokens=1024)
    sampler.setup(tokenizer)
    agent.setup(tokenizer, sampler)
    start = time.monotonic()
    batch, metrics = _run(agent, sampler, tokenizer)
    assert time.monotonic() - start < 4 and len(sampler.calls) == 1
    assert float(metrics["agent/timeout_frac"]) == 1 and batch.batch_size == 4


def test_sigterm_ends_a_round_sampling_at_once_and_is_not_trained():
    import os
    import signal
    import threading
    import time

    from components.rollout.endpoint.agent import RoundInterrupted
    from tests.support.openai import EndlessSampler

    tokenizer = family_tokenizer("chatml")
    sampler = EndlessSampler(tokenizer, "chatml", group_size=2, seconds=60)
    agent = OpenAIAgent(f"{__name__}.tool_agent", tool_calls=HermesToolCalls(), timeout_s=300, max_total_tokens=1024)
    sampler.setup(tokenizer)
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))  # e.g. Lightning's
    try:
        agent.setup(tokenizer, sampler)
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
        start = time.monotonic()
        with pytest.raises(RoundInterrupted, match="SIGTERM while 4 episodes sampled"):
            _run(agent, sampler, tokenizer)
        assert time.monotonic() - start < 4  # timeout_s is 300, the sampler call 60 s
        assert seen == [signal.SIGTERM]  # the handler that was there still runs
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_episode_that_raised_after_its_deadline_is_a_timeout_and_one_that_raised_before_is_an_error():
    """When the round's last deadline passes, its sampler call is cut and the agents waiting on it raise: an agent
    that raised past its own deadline is counted a timeout (under load the check could see its exception first and
    count an error), one that raised within it an error of its own, one that returned late is done."""
    import time
    from concurrent.futures import Future
    from types import SimpleNamespace

    from components.rollout.endpoint.rounds import EpisodeRun, Round

    def episode(key: str, deadline: float, raised: Exception | None = None) -> EpisodeRun:
        future = Future()
        future.set_exception(raised) if raised is not None else future.set_result({"answer": "4"})
        return EpisodeRun(key, {}, [1], conversation=None, deadline=deadline, future=future)

    now = time.monotonic()
    late, early, done_late = (
        episode("late", now - 1.0, RuntimeError("the sampler call was cut")),
        episode("early", now + 60.0, ValueError("the agent's own bug")),
        episode("done_late", now - 1.0),
    )
    closed = []
    agent = SimpleNamespace(timeout_s=1.0, endpoint=SimpleNamespace(close_episode=closed.append))
    round_ = Round(agent, sampler=None, policy=None, params=None, episodes=[late, early, done_late])
    assert round_._check() is False
    assert (late.status, late.error) == ("timeout", "no result within 1.0 s")
    assert (early.status, early.error) == ("error", "ValueError: the agent's own bug")
    assert (done_late.status, done_late.result) == ("done", {"answer": "4"})
    assert sorted(closed) == ["done_late", "early", "late"]


@pytest.mark.parametrize("family, template", [("deep_hermes", "chatml"), ("deep_json", "llama3")])
def test_a_call_the_model_nests_1000_deep_is_text_and_sampling_goes_on(family, template):
    """The model's own turn ``{"name": "calc", "arguments": [[[[...`` 1,000 deep: a malformed call, left in the text (it
    raised RecursionError in the round's sampling, which ended the run)."""
    tokenizer = family_tokenizer(template)
    sampler = ScriptedChat(tokenizer, family)
    batch, metrics = _run(_agent("tool_agent", tokenizer, sampler, family), sampler, tokenizer)
    assert float(metrics["agent/error_frac"]) == 0 and float(metrics["agent/tool_calls_mean"]) == 0
    assert [result["answer"].count("[") for result in batch.columns["result"]] == [1000, 1000]
    assert batch.batch_size == 2 and (batch.action_tokens.sum(-1) > 2000).all()  # each sampled turn trained


@pytest.mark.parametrize("parser", [HermesToolCalls(), JsonToolCalls()])
def test_both_parsers_take_a_call_nested_past_the_bound_or_holding_1e999_as_text(parser):
    wrap = (lambda call: f"<tool_call>{call}</tool_call>") if isinstance(parser, HermesToolCalls) else (lambda c: c)
    for arguments in ("[" * 100_000 + "]" * 100_000, "[" * 65 + "]" * 65, '{"x": 1e999}', '{"x": NaN}'):
        text = wrap('{"name": "calc", "arguments": ' + arguments + "}")
        assert parser.parse(text) == (text, [])
    inside = wrap('{"name": "calc", "arguments": ' + "[" * 62 + "]" * 62 + "}")  # 64 levels with the call's own
    assert parser.parse(inside)[1][0]["function"]["arguments"] == "[" * 62 + "]" * 62
