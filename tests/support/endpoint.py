"""Raw HTTP against the agents' endpoint (what a broken or hostile client sends), and agents whose requests the run
cannot serve: shared by tests/components/test_openai_endpoint.py, test_openai_agent.py and the fault matrix
(tests/test_fault_matrix.py)."""

from __future__ import annotations

import socket


def raw(endpoint, head: bytes, body: bytes = b"", timeout: float = 5.0) -> bytes:
    """Send ``head`` (and ``body``) on a fresh connection; everything the server answers until it closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=timeout) as sock:
        sock.sendall(head + body)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except (socket.timeout, ConnectionResetError):
            pass
        return out


def head(endpoint, path: str = "/e/v1/completions", token: str | None = None, **headers) -> bytes:
    """A POST head with the key of the path's episode (or ``token``) and ``headers`` (``Content_Length=5``:
    Content-Length: 5)."""
    key = token or endpoint.token(path.lstrip("/").partition("/")[0])
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {key}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def unservable_agent(client, row) -> list[str]:
    """Requests no sampler can serve: token ids outside the vocabulary, another model, a forced tool call."""
    import openai

    messages = []
    for call in (
        lambda: client.completions.create(model="policy", prompt=[999999, -5], max_tokens=2),
        lambda: client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}]),
        lambda: client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}], tool_choice="required"
        ),
    ):
        try:
            call()
            messages.append("sampled")
        except openai.BadRequestError as err:
            messages.append(err.body["message"])
    return messages


def calc_agent_or_hang(client, row):
    """examples/openai_calc_agent.py's agent, until the file named by $HANG_MARKER exists: from then on each episode
    asks the model once and never returns (leaving ``<marker>.hung`` behind, so a test knows a round is stuck)."""
    import os
    import time
    from pathlib import Path

    from examples.openai_calc_agent import agent

    marker = Path(os.environ["HANG_MARKER"])
    if not marker.exists():
        return agent(client, row)
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}], max_tokens=2)
    Path(f"{marker}.hung").touch()
    while True:
        time.sleep(1.0)


def send_as_written(client, route: str, body: str) -> list:
    """``body``, JSON text as written (no OpenAI client writes ``1e999`` or 100,000 brackets), to the episode's
    ``route`` with its key: [status, the error's message] (or [200, "sampled"])."""
    import httpx

    answer = httpx.post(
        f"{client.base_url}{route}",
        content=body.encode(),
        headers={"Authorization": f"Bearer {client.api_key}", "Content-Type": "application/json"},
        trust_env=False,
        timeout=60,
    )
    if answer.status_code == 200:
        return [200, "sampled"]
    is_json = answer.headers.get("content-type") == "application/json"
    return [answer.status_code, answer.json()["error"]["message"] if is_json else answer.text]


CHAT = '{"model": "policy", "messages": [{"role": "user", "content": "1*2="}]%s}'
COMPLETION = '{"model": "policy", "prompt": "1*2=", "max_tokens": 2%s}'


def overflowing_agent(client, row) -> list[list]:
    """Numbers no parameter can take and a ``stop`` that is not text; then a call that is fine."""
    calls = [
        ("chat/completions", CHAT % ', "n": 1e999'),
        ("chat/completions", CHAT % ', "logprobs": 1e999'),
        ("completions", COMPLETION % ', "logprobs": 1e999'),
        ("completions", COMPLETION % ', "n": -1e999'),
        ("chat/completions", CHAT % ', "n": NaN'),
        ("chat/completions", CHAT % ', "n": 2.0'),
        ("completions", COMPLETION % ', "logprobs": 5'),
        ("chat/completions", CHAT % ', "stop": {"=": 1}'),
        ("chat/completions", CHAT % ', "stop": ["=", 7]'),
        ("completions", COMPLETION % ', "logprobs": 1, "stop": "="'),
    ]
    return [send_as_written(client, route, body) for route, body in calls]


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def deeply_nested_agent(client, row) -> list[list]:
    """``tools`` 5,000 and 800 deep, a call's arguments (JSON text) 1,000 deep and an object 100 deep, a body 100,000
    deep; then a call that is fine."""
    import json

    def tools(depth: int) -> str:
        return ', "tools": [{"type": "function", "function": {"name": "calc", "parameters": %s}}]' % nested(depth)

    def history(arguments: str) -> str:  # ``arguments``: their JSON text, as written into the body
        call = {"id": "call_0", "type": "function", "function": {"name": "calc", "arguments": "ARGUMENTS"}}
        messages = [
            {"role": "user", "content": "1*2="},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": "2"},
        ]
        return json.dumps({"model": "policy", "messages": messages}).replace('"ARGUMENTS"', arguments)

    calls = [
        ("chat/completions", CHAT % tools(5000)),
        ("chat/completions", CHAT % tools(800)),
        ("chat/completions", history(json.dumps(nested(1000)))),
        ("chat/completions", history(nested(100))),
        ("chat/completions", nested(100_000)),
        ("chat/completions", CHAT % ""),
    ]
    return [send_as_written(client, route, body) for route, body in calls]
