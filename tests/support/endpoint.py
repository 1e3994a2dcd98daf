"""Raw HTTP against the agents' endpoint (what a broken or hostile client sends), and agents whose requests the run
cannot serve: shared by tests/components/test_openai_endpoint.py, test_openai_agent.py and the fault matrix
(tests/test_fault_matrix.py)."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import Future


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


def echo(route: str, request: dict) -> Future:
    """A handler that answers at once with what it was sent."""
    future: Future = Future()
    future.set_result((200, {"route": route, "request": request}))
    return future


def post(endpoint, prompt: str = "1", episode: str = "e"):
    """``{"prompt": prompt}`` to ``episode``'s /completions through an agent's HTTP client (which sends a 503 again)."""
    from components.rollout.endpoint.http_client import episode_http_client

    with episode_http_client(asynchronous=False) as client:
        return client.post(
            endpoint.base_url(episode) + "/completions",
            json={"prompt": prompt},
            headers={"Authorization": f"Bearer {endpoint.token(episode)}"},
        )


def closed_by_the_server(sockets: list[socket.socket], at_least: int, timeout: float = 5.0) -> list[socket.socket]:
    """Wait until ``at_least`` of ``sockets`` read their end (the server closed them); those that did."""
    import select

    closed, deadline = [], time.monotonic() + timeout
    while len(closed) < at_least and time.monotonic() < deadline:
        readable, _, _ = select.select([s for s in sockets if s not in closed], [], [], 0.1)
        closed += [s for s in readable if s.recv(1) == b""]
    return closed


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def check_idle_connections_give_their_slots_up() -> None:
    """80 connections that never send a head, past max_connections 64: the oldest 16 are closed as the others open,
    and a request with a key is served at once (its first answer 200, not 503), within 2 s through an agent's client."""
    from components.rollout.endpoint.server import Endpoint, EndpointLimits

    body = b'{"model": "policy", "prompt": "1"}'
    endpoint = Endpoint(limits=EndpointLimits(max_connections=64))
    endpoint.open("e", echo)
    idle = [socket.create_connection(("127.0.0.1", endpoint.port), timeout=10) for _ in range(80)]
    try:
        assert len(closed_by_the_server(idle, 16)) == 16  # the oldest, as the 65th to 80th opened
        start = time.monotonic()
        first = raw(endpoint, head(endpoint, Content_Length=len(body), Connection="close"), body)
        assert first.startswith(b"HTTP/1.1 200 ")  # a fresh connection: no retry needed
        answer = post(endpoint)
        assert answer.status_code == 200 and answer.json()["request"] == {"prompt": "1"}
        assert time.monotonic() - start < 2
    finally:
        for sock in idle:
            sock.close()
        endpoint.close()


def check_bytes_past_the_bound_wait_unread() -> None:
    """Three bodies of 1 MiB (two with a Content-Length, one chunked) under max_bytes_in_flight 1.5 MiB, each held by
    the handler until released: one at a time is read; the next only once the one before is answered."""
    from components.rollout.endpoint.server import Endpoint, EndpointLimits

    endpoint = Endpoint(limits=EndpointLimits(max_request_mb=1.0, max_bytes_in_flight=3 * 2**19))
    held: list[tuple[dict, Future]] = []
    lock = threading.Lock()

    def hold(route: str, request: dict) -> Future:
        future: Future = Future()
        with lock:
            held.append((request, future))
        return future

    def read() -> list[str]:
        with lock:
            return [request["prompt"][:1] for request, _ in held]

    def answer(i: int) -> None:
        with lock:
            held[i][1].set_result((200, {}))

    endpoint.open("e", hold)
    big = {name: b'{"prompt": "%s"}' % (name.encode() * (2**20 - 16)) for name in "abc"}
    send = {name: (head(endpoint, Content_Length=len(big[name]), Connection="close"), big[name]) for name in ("a", "b")}
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(big["c"]), big["c"])  # takes max_request_mb until it is read
    send["c"] = (head(endpoint, Transfer_Encoding="chunked", Connection="close"), chunked)
    answers: dict[str, bytes] = {}
    threads = {
        name: threading.Thread(target=lambda n=name: answers.update({n: raw(endpoint, *send[n], timeout=20)}))
        for name in send
    }
    try:
        threads["a"].start()
        wait_for(lambda: read() == ["a"])
        threads["b"].start()
        threads["c"].start()
        time.sleep(0.5)  # time enough to read them: neither is (a's megabyte and either of theirs pass the bound)
        assert read() == ["a"]
        answer(0)
        wait_for(lambda: len(read()) == 2)  # b or c, whichever came first, but not both
        time.sleep(0.3)
        assert len(read()) == 2
        answer(1)
        wait_for(lambda: len(read()) == 3)
        answer(2)
        for thread in threads.values():
            thread.join(timeout=20)
    finally:
        endpoint.close()
    assert sorted(read()) == ["a", "b", "c"]
    assert len(answers) == 3 and all(answer.startswith(b"HTTP/1.1 200 ") for answer in answers.values())


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
