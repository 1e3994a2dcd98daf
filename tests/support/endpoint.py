"""Raw HTTP against the agents' endpoint (what a broken or hostile client sends), and an agent whose requests the run
cannot serve: shared by tests/components/test_openai_endpoint.py and the fault matrix (tests/test_fault_matrix.py)."""

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
    """A POST head with the run's token (or ``token``) and ``headers`` (``Content_Length=5``: Content-Length: 5)."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {token or endpoint.token}"]
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
