"""OpenAIAgent and its endpoint: an agent that raises, hangs, never calls or is cancelled gives a scored failure and a
counted metric, never a hung run; only the run's token reaches the sampler; async agents; /v1/completions continues
the recorded ids; requests the endpoint cannot honour are refused with OpenAI's error shape."""

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


def _setup(function: str, group_size: int = 2, **kwargs):
    tokenizer = load_tokenizer(TINY_CALC)
    sampler = HFRollout(group_size=group_size, max_new_tokens=6, temperature=1.0, return_logprobs=True)
    sampler.setup(tokenizer)
    agent = OpenAIAgent(
        f"{__name__}.{function}", tool_calls=TagToolCalls("calc", "expression"), max_total_tokens=40, **kwargs
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


def test_only_the_runs_token_reaches_the_sampler_on_loopback(policy):
    import httpx

    URLS.clear()
    agent, sampler, tokenizer = _setup("url_agent", group_size=1)
    try:
        batch, _ = _run(agent, sampler, tokenizer, policy)
        url, key = URLS[0]
        assert url.startswith("http://127.0.0.1:") and key == agent.endpoint.token
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
    sampler = HFRollout(group_size=2, return_logprobs=True)
    with pytest.raises(ValueError, match="is not a function"):
        OpenAIAgent(f"{__name__}.no_such_agent").setup(tokenizer, sampler)
    with pytest.raises(ImportError, match="cannot import 'no_such_module'"):
        OpenAIAgent("no_such_module.agent").setup(tokenizer, sampler)


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
