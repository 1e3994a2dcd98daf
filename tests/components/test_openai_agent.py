"""OpenAIAgent and its endpoint: an agent that raises, hangs, never calls or is cancelled gives a scored failure and a
counted metric, never a hung run; only an episode's own key reaches the sampler, at its own URL; async agents;
/v1/completions continues the recorded ids; requests the endpoint cannot honour (or parse safely) are refused with
OpenAI's error shape."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import torch

from components.rollout import HFRollout, OpenAIAgent
from components.rollout.endpoint import TagToolCalls
from lightning_rl.core.models import ModelSpec, load_causal_lm, load_tokenizer
from tests.helpers import prompts

pytestmark = pytest.mark.server  # the agents' endpoint listens on a port

TINY_CALC = str(Path(__file__).resolve().parents[2] / "lightning_rl/assets/tiny-calc")
URLS: list[str] = []


def raising_agent(client, row):
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    raise RuntimeError("the agent's own bug")


def hanging_agent(client, row):
    time.sleep(30)


def lazy_agent(client, row):
    return "42"


def url_agent(client, row):
    URLS.append((str(client.base_url), client.api_key))
    return (
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
        .choices[0]
        .message.content
    )


async def async_agent(client, row):
    first, second = await asyncio.gather(
        *[
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
            for _ in range(2)
        ]
    )
    return first.choices[0].message.content


def completion_agent(client, row):
    """Text in, text out: each call's prompt is the last one plus its completion plus a result."""
    prompt, calls = row["prompt"], []
    for _ in range(2):
        response = client.completions.create(model="policy", prompt=prompt, max_tokens=6, logprobs=1)
        calls.append(
            (response.prompt_token_ids, response.choices[0].token_ids, response.choices[0].logprobs.token_logprobs)
        )
        prompt = prompt + response.choices[0].text + "<result>7</result>"
    return {"answer": response.choices[0].text, "calls": calls}


def refused_agent(client, row):
    import openai

    errors = []
    for extra in ({"n": 2}, {"stream": False, "max_tokens": 0}):
        try:
            client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": row["prompt"]}], **extra
            )
        except openai.BadRequestError as err:
            errors.append(err.body["message"])
    return errors


@pytest.fixture(scope="module")
def policy():
    return load_causal_lm(ModelSpec(path=TINY_CALC))


def _setup(function: str, group_size: int = 2, in_module: bool = True, **kwargs):
    tokenizer = load_tokenizer(TINY_CALC)
    sampler = HFRollout(group_size=group_size, max_new_tokens=6, temperature=1.0, return_logprobs=True)
    sampler.setup(tokenizer)
    agent = OpenAIAgent(
        f"{__name__}.{function}" if in_module else function,
        tool_calls=TagToolCalls("calc", "expression"),
        max_total_tokens=40,
        **kwargs,
    )
    agent.setup(tokenizer, sampler)
    return agent, sampler, tokenizer


def _run(agent, sampler, tokenizer, policy, texts=("12*34=", "56*78=")):
    rows = [{"prompt": t, "answer": "0"} for t in texts]
    ids = tokenizer([r["prompt"] for r in rows], return_tensors="pt").input_ids
    return agent.generate(sampler, prompts(ids, None, rows), policy)


def test_an_agent_that_raises_is_a_scored_failure_with_its_tokens_kept(policy):
    agent, sampler, tokenizer = _setup("raising_agent")
    try:
        batch, metrics = _run(agent, sampler, tokenizer, policy)
    finally:
        agent.close()
    assert float(metrics["agent/error_frac"]) == 1 and float(metrics["agent/turns_mean"]) == 1
    assert batch.batch_size == 4 and batch.columns["result"] == [None] * 4 and batch.columns["completions"] == [""] * 4
    assert all("RuntimeError: the agent's own bug" in e for e in batch.columns["agent_error"])
    assert (batch.action_tokens.sum(-1) > 0).all()  # what it sampled is trained, scored as the failure it led to


def test_a_hanging_agent_ends_at_its_deadline_and_one_that_never_calls_gets_an_empty_row(policy):
    agent, sampler, tokenizer = _setup("hanging_agent", timeout_s=0.5)
    start = time.monotonic()
    try:
        batch, metrics = _run(agent, sampler, tokenizer, policy)
    finally:
        agent.close()
    assert time.monotonic() - start < 5
    assert float(metrics["agent/timeout_frac"]) == 1 and float(metrics["agent/no_call_frac"]) == 1
    assert batch.batch_size == 4 and int(batch.response_mask.sum()) == 0 and batch.columns["completions"] == [""] * 4
    assert (
        batch.prompt_ids[0][batch.prompt_mask[0].bool()].tolist() == tokenizer("12*34=").input_ids
    )  # the data's prompt

    agent, sampler, tokenizer = _setup("lazy_agent")
    try:
        batch, metrics = _run(agent, sampler, tokenizer, policy)
    finally:
        agent.close()
    assert float(metrics["agent/no_call_frac"]) == 1 and float(metrics["agent/error_frac"]) == 0
    assert batch.columns["completions"] == ["42"] * 4 and int(batch.response_mask.sum()) == 0


def test_cancel_ends_a_round_under_way_at_once(policy):
    agent, sampler, tokenizer = _setup("hanging_agent", timeout_s=60)
    out = {}
    thread = threading.Thread(
        target=lambda: out.update(zip(("batch", "metrics"), _run(agent, sampler, tokenizer, policy)))
    )
    start = time.monotonic()
    thread.start()
    time.sleep(0.5)
    agent.cancel()
    thread.join(timeout=10)
    agent.close()
    assert not thread.is_alive() and time.monotonic() - start < 5
    assert float(out["metrics"]["agent/timeout_frac"]) == 1 and out["batch"].batch_size == 4


def test_only_an_episodes_own_key_reaches_the_sampler_on_loopback(policy):
    import httpx

    URLS.clear()
    agent, sampler, tokenizer = _setup("url_agent", group_size=1)
    try:
        batch, _ = _run(agent, sampler, tokenizer, policy)
        url, key = URLS[0]
        assert url.startswith("http://127.0.0.1:") and key == agent.endpoint.token(url.split("/")[3])  # its episode's
        body = {"model": "policy", "messages": [{"role": "user", "content": "1*2="}]}
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            answer = httpx.post(url + "chat/completions", json=body, headers=headers, trust_env=False)
            assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"
        ended = httpx.post(
            url + "chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, trust_env=False
        )
        assert ended.status_code == 404 and ended.json()["error"]["code"] == "episode_ended"  # the episode has returned
        models = httpx.get(url + "models", headers={"Authorization": f"Bearer {key}"}, trust_env=False).json()
        assert models["data"][0]["id"] == "policy"
    finally:
        agent.close()
    assert len(URLS) == 2 and len({url for url, _ in URLS}) == 2  # a path per episode
    assert len({key for _, key in URLS}) == 2  # and a key per episode


CROSSING: dict[str, str] = {}
CROSSED = threading.Barrier(2, timeout=30)


def crossing_agent(client, row):
    """Sends a request to the other episode's URL with its own key (both episodes run at once), then calls its own."""
    import httpx

    CROSSING[row["prompt"]] = str(client.base_url)
    CROSSED.wait()
    other = next(url for prompt, url in CROSSING.items() if prompt != row["prompt"])
    body = {"model": "policy", "messages": [{"role": "user", "content": row["prompt"]}]}
    headers = {"Authorization": f"Bearer {client.api_key}"}
    crossed = httpx.post(other + "chat/completions", json=body, headers=headers, trust_env=False, timeout=30)
    client.chat.completions.create(**body)
    return [crossed.status_code, crossed.json()["error"]["code"]]


def test_an_episodes_key_is_refused_at_another_episodes_url_and_makes_no_row(policy):
    """Was one key for the run: episode A's request at B's URL was served, and became B's training rows (scored with
    B's reward)."""
    CROSSING.clear()
    CROSSED.reset()
    agent, sampler, tokenizer = _setup("crossing_agent", group_size=1)
    try:
        batch, metrics = _run(agent, sampler, tokenizer, policy)
    finally:
        agent.close()
    assert batch.columns["result"] == [[403, "wrong_episode"]] * 2
    assert batch.batch_size == 2 and float(metrics["agent/turns_mean"]) == 1  # each episode's own call, one row each
    assert float(metrics["agent/error_frac"]) == 0


def test_an_async_agent_gets_an_async_client_and_its_concurrent_calls_are_separate_rows(policy):
    agent, sampler, tokenizer = _setup("async_agent")
    try:
        batch, metrics = _run(agent, sampler, tokenizer, policy)
    finally:
        agent.close()
    assert float(metrics["agent/turns_mean"]) == 2 and float(metrics["agent/error_frac"]) == 0
    assert float(metrics["agent/prefix_breaks"]) == 4  # the second call of each episode asks for the same turn again
    assert batch.batch_size == 8 and (batch.action_tokens.sum(-1) > 0).all()


def test_completions_continue_the_recorded_ids_and_answer_the_samplers_logprobs(policy):
    agent, sampler, tokenizer = _setup("completion_agent", group_size=1)
    try:
        batch, metrics = _run(agent, sampler, tokenizer, policy)
    finally:
        agent.close()
    assert float(metrics["agent/prefix_breaks"]) == 0 and float(metrics["agent/turns_mean"]) == 2
    for i in range(batch.batch_size):
        calls = batch.columns["result"][i]["calls"]
        n = int(batch.response_mask[i].sum())
        row = batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist() + batch.response_ids[i, :n].tolist()
        assert row[: len(calls[1][0])] == calls[1][0] and calls[1][0][: len(calls[0][0])] == calls[0][0]
        sampled = batch.response_ids[i][batch.action_mask[i].bool()].tolist()
        assert sampled == calls[0][1] + calls[1][1]
        logprobs = batch.rollout_logprobs[i][batch.action_mask[i].bool()]
        assert torch.allclose(logprobs, torch.tensor(calls[0][2] + calls[1][2]))


def test_requests_the_endpoint_cannot_honour_are_refused_in_openais_error_shape(policy):
    agent, sampler, tokenizer = _setup("refused_agent", group_size=1)
    try:
        batch, _ = _run(agent, sampler, tokenizer, policy, texts=("1*2=",))
    finally:
        agent.close()
    errors = batch.columns["result"][0]
    assert "n must be 1" in errors[0] and "max_tokens must be a positive integer" in errors[1]


def test_setup_names_what_is_missing(tokenizer):
    sampler = HFRollout(group_size=2, return_logprobs=False)
    with pytest.raises(ValueError, match="return_logprobs: true"):
        OpenAIAgent(f"{__name__}.lazy_agent").setup(tokenizer, sampler)


def test_a_function_that_does_not_import_fails_at_construction_with_the_closest_name():
    from lightning_rl.core.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"has no 'lazy_agnt' \(did you mean {__name__}.lazy_agent\?\)"):
        OpenAIAgent(f"{__name__}.lazy_agnt")
    with pytest.raises(ConfigError, match="cannot import no_such_module.agent: no module 'no_such_module'; give"):
        OpenAIAgent("no_such_module.agent")
    with pytest.raises(ConfigError, match=r"examples.openai_calc_agent.CALCULATOR is a dict, not a function"):
        OpenAIAgent("examples.openai_calc_agent.CALCULATOR")


def test_a_client_that_resets_its_idle_connection_prints_no_trace(capfd):
    """A pooled client drops its keep-alive connections at will; http.server printed a 20-line trace for each."""
    import socket
    import struct

    from components.rollout.endpoint.server import Endpoint

    endpoint = Endpoint()
    try:
        sock = socket.create_connection(("127.0.0.1", endpoint.port))
        sock.setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )  # close with RST, as a reset pool does
        time.sleep(0.2)
        sock.close()
        time.sleep(0.5)
    finally:
        endpoint.close()
    assert "Traceback" not in capfd.readouterr().err


# ---------------------------------------------------------------- probes: no request breaks the run
def huge_message_agent(client, row):
    import openai

    try:
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "1" * 5_000_000}])
    except openai.BadRequestError as err:
        return err.body["message"]
    return "sampled"


def out_of_vocabulary_agent(client, row):
    import openai

    try:
        client.completions.create(model="policy", prompt=[999999, -5], max_tokens=2)
    except openai.BadRequestError as err:
        return err.body["message"]
    return "sampled"


def unhonoured_agent(client, row):
    import openai

    errors = {}
    base = {"model": "policy", "messages": [{"role": "user", "content": row["prompt"]}]}
    for name, extra in {
        "top_logprobs": {"logprobs": True, "top_logprobs": 5},
        "model": {"model": "gpt-4o"},
        "tool_choice": {"tool_choice": "required"},
        "response_format": {"response_format": {"type": "json_object"}},
        "unknown": {"extra_body": {"guided_regex": "[0-9]+"}},
    }.items():
        try:
            client.chat.completions.create(**{**base, **extra})
            errors[name] = "sampled"
        except openai.BadRequestError as err:
            errors[name] = err.body["message"]
    return errors


async def flooding_agent(client, row):
    """300 calls at once from one episode, all asking for the same first turn."""
    import openai

    async def one():
        try:
            await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
            return "sampled"
        except openai.BadRequestError as err:
            return err.body["error"]["code"] if "error" in (err.body or {}) else err.code

    return await asyncio.gather(*[one() for _ in range(300)])


def chatty_agent(client, row):
    import openai

    outcomes = []
    for _ in range(4):
        try:
            client.completions.create(model="policy", prompt=row["prompt"], max_tokens=1)
            outcomes.append("sampled")
        except openai.BadRequestError as err:
            outcomes.append(err.code)
    return outcomes


async def branching_agent(client, row):
    """One turn, then two calls at once that both continue it: two branches of one context. The episode of "9*9="
    only waits, so that the driver waits for a second call and the two branches meet in one sampler call."""
    if row["prompt"] == "9*9=":
        await asyncio.sleep(3)
        return None
    first = await client.completions.create(model="policy", prompt=row["prompt"], max_tokens=2)
    text = row["prompt"] + first.choices[0].text + "<result>7</result>"
    answers = await asyncio.gather(
        *[client.completions.create(model="policy", prompt=text, max_tokens=2) for _ in range(2)]
    )
    return {
        "first": first.choices[0].token_ids,
        "branches": [(a.prompt_token_ids, a.choices[0].token_ids) for a in answers],
    }


def test_a_5_mb_message_is_refused_before_it_is_tokenised_naming_the_context(policy):
    import resource

    agent, sampler, tokenizer = _setup("huge_message_agent", group_size=1)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    try:
        batch, metrics = _run(agent, sampler, tokenizer, policy, texts=("1*2=",))
    finally:
        agent.close()
    message = batch.columns["result"][0]
    assert "max_position_embeddings) is 64" in message and "at least" in message  # tokenising it took 14 s and 1.9 GB
    assert time.monotonic() - start < 10
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024 < 300  # MiB over the peak so far
    assert float(metrics["agent/error_frac"]) == 0


def test_numbers_no_parameter_takes_and_a_stop_that_is_not_text_are_400_and_the_run_goes_on(policy):
    """ "n": 1e999 or "logprobs": 1e999 raised OverflowError in the round (the run died in its first iteration, without a
    checkpoint); "stop": {...} was taken."""
    agent, sampler, tokenizer = _setup("tests.support.endpoint.overflowing_agent", group_size=1, in_module=False)
    try:
        batch, metrics = _run(agent, sampler, tokenizer, policy, texts=("1*2=",))
    finally:
        agent.close()
    answers = batch.columns["result"][0]
    assert [status for status, _ in answers] == [400] * 9 + [200]
    assert all("the number 1e999 is too large for a float" in message for _, message in answers[:3])
    assert "-1e999 is too large" in answers[3][1] and "NaN is not a JSON number" in answers[4][1]
    assert answers[5][1] == "BadRequest: n must be a whole number, got 2.0"
    assert answers[6][1].startswith("BadRequest: logprobs 5 is not supported")
    assert [message.split(", got")[0] for _, message in answers[7:9]] == [
        "BadRequest: stop must be a text or a list of texts"
    ] * 2
    assert float(metrics["agent/error_frac"]) == 0 and batch.batch_size == 1


def test_requests_nested_deep_are_400_with_no_trace_and_the_run_goes_on(policy, capfd):
    """tools 800 and 5,000 deep and a call's arguments 1,000 deep raised RecursionError in the round (it died); a body
    100,000 deep was a 500 and a traceback in the trainer's log."""
    agent, sampler, tokenizer = _setup("tests.support.endpoint.deeply_nested_agent", group_size=1, in_module=False)
    try:
        batch, metrics = _run(agent, sampler, tokenizer, policy, texts=("1*2=",))
    finally:
        agent.close()
    answers = batch.columns["result"][0]
    assert [status for status, _ in answers] == [400] * 5 + [200]
    for status, message in answers[:2] + answers[3:5]:
        assert message.endswith("it nests arrays and objects more than 64 deep"), message
    assert answers[2][1] == "ValueError: a tool call's arguments nest arrays and objects more than 64 deep"
    assert float(metrics["agent/error_frac"]) == 0 and batch.batch_size == 1
    assert "Traceback" not in capfd.readouterr().err


def test_token_ids_outside_the_vocabulary_are_refused_and_the_run_goes_on(policy):
    agent, sampler, tokenizer = _setup("out_of_vocabulary_agent", group_size=1)
    try:
        batch, _ = _run(agent, sampler, tokenizer, policy, texts=("1*2=",))  # was a bare IndexError ending the run
    finally:
        agent.close()
    assert batch.columns["result"][0] == "BadRequest: prompt token ids outside the vocabulary [0, 22): [999999, -5]"


def test_parameters_the_endpoint_does_not_honour_are_refused(policy):
    agent, sampler, tokenizer = _setup("unhonoured_agent", group_size=1)
    try:
        batch, _ = _run(agent, sampler, tokenizer, policy, texts=("1*2=",))
    finally:
        agent.close()
    errors = batch.columns["result"][0]
    assert "top_logprobs is not supported" in errors["top_logprobs"]
    assert "model 'gpt-4o' is not served here: this endpoint serves 'policy'" in errors["model"]
    assert "tool_choice 'required' is not supported" in errors["tool_choice"]
    assert "response_format other than text is not supported" in errors["response_format"]
    assert "unsupported parameter(s) ['guided_regex']" in errors["unknown"]


def test_300_calls_at_once_from_one_episode_make_at_most_max_rows_per_episode_rows(policy):
    agent, sampler, tokenizer = _setup("flooding_agent", group_size=1, max_rows_per_episode=4)
    try:
        batch, metrics = _run(agent, sampler, tokenizer, policy, texts=("1*2=",))
    finally:
        agent.close()
    outcomes = batch.columns["result"][0]
    # the first 256 calls (max_calls_per_episode) are taken: 4 rows sampled, 252 refused for rows; the last 44 for calls
    assert outcomes.count("sampled") == 4 and outcomes.count("episode_row_limit") == 252
    assert outcomes.count("episode_call_limit") == 44
    assert batch.batch_size == 4 and float(metrics["agent/prefix_breaks"]) == 3  # was 309 rows, 308 breaks
    assert float(metrics["agent/row_limit_frac"]) == 1 and float(metrics["agent/call_limit_frac"]) == 1


def test_calls_past_max_calls_per_episode_are_refused_and_counted(policy):
    agent, sampler, tokenizer = _setup("chatty_agent", group_size=1, max_calls_per_episode=3)
    try:
        batch, metrics = _run(agent, sampler, tokenizer, policy, texts=("1*2=", "3*4="))
    finally:
        agent.close()
    assert all(result == ["sampled"] * 3 + ["episode_call_limit"] for result in batch.columns["result"])
    assert float(metrics["agent/call_limit_frac"]) == 1 and float(metrics["agent/turns_mean"]) == 3


def test_two_calls_continuing_one_row_at_once_are_two_rows_each_exactly_as_sampled(policy):
    agent, sampler, tokenizer = _setup("branching_agent", group_size=1)
    try:
        batch, metrics = _run(agent, sampler, tokenizer, policy, texts=("1*2=", "9*9="))
    finally:
        agent.close()
    result = batch.columns["result"][0]
    assert float(metrics["agent/prefix_breaks"]) == 1 and batch.batch_size == 4
    full = sorted(
        batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist()
        + batch.response_ids[i, : int(batch.response_mask[i].sum())].tolist()
        for i in range(2)
    )
    # each row is one branch's context and its sampled turn: the row of the first turn holds one branch, the other
    # branch is a row of its own (before, both were appended to the first row: a context nobody sampled from)
    assert full == sorted(prompt + sampled for prompt, sampled in result["branches"])
    sampled = sorted(batch.response_ids[i][batch.action_mask[i].bool()].tolist() for i in range(2))
    assert sampled == sorted(
        [result["first"] + result["branches"][0][1], result["branches"][1][1]]
    ) or sampled == sorted([result["first"] + result["branches"][1][1], result["branches"][0][1]])


def test_a_round_where_episodes_failed_prints_one_line_with_their_count_and_the_first_error(policy, capfd):
    agent, sampler, tokenizer = _setup("raising_agent")
    try:
        _run(agent, sampler, tokenizer, policy)
    finally:
        agent.close()
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("agents:")]
    assert lines == ["agents: 4 of 4 episodes failed (4 error); the first: RuntimeError: the agent's own bug"]
    agent, sampler, tokenizer = _setup("lazy_agent")
    try:
        _run(agent, sampler, tokenizer, policy)
    finally:
        agent.close()
    assert "agents:" not in capfd.readouterr().err  # nothing when none failed


def test_each_episode_has_a_connection_pool_of_its_own_closed_with_it(policy, monkeypatch):
    """Episodes sharing one httpx pool lost calls under load (httpcore closed connections handed to other threads:
    ``ReadError: [Errno 9] Bad file descriptor``, 1-2 of 1,024 episodes per round); each now has its own."""
    from components.rollout.endpoint import http_client

    made = []
    build = http_client.episode_http_client
    monkeypatch.setattr(
        http_client, "episode_http_client", lambda asynchronous: made.append(build(asynchronous)) or made[-1]
    )
    agent, sampler, tokenizer = _setup("url_agent")
    try:
        _run(agent, sampler, tokenizer, policy)
    finally:
        agent.close()
    assert len(made) == 4 and len({id(c) for c in made}) == 4 and all(c.is_closed for c in made)


def test_without_max_total_tokens_a_row_holds_the_policys_context_less_its_prompt(tokenizer):
    from components.rollout.endpoint.conversation import ContextFull, Conversation

    conversation = Conversation(None, tokenizer, None, context=12)
    pending = conversation.text([5, 6, 7, 8])  # a 4-token prompt: 8 positions left
    assert conversation.room(pending) == 8
    conversation.commit(pending, [9, 9, 9], None, [0, 0, 0], None, False)
    with pytest.raises(
        ContextFull,
        match=r"holds 3 \+ 5 new tokens, and the policy's context \(max_position_embeddings 12\) less the row's prompt "
        r"\(4\) leaves 8: no room for another turn",
    ):
        conversation.text([5, 6, 7, 8, 9, 9, 9, 1, 1, 1, 1, 1])  # 3 + 5 + 1 to sample > 8
    with pytest.raises(ValueError, match="the policy's context is unknown: give max_total_tokens"):
        Conversation(None, tokenizer, None, context=None)
