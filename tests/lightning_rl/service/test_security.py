"""What `lightning-rl serve` refuses: a request without the key it was started with (401, before its body is read),
a body past ``limits.max_request_mb`` however it arrives (413: declared, streamed, or zstd that inflates past it), and
one key's client reaching for another key's weights (404). Driven by the official SDK where it can make the request,
by raw HTTP where it cannot (the SDK always sends a key and a bounded body)."""

import socket
import time

import httpx
import pytest

from lightning_rl.service import ServeLimits
from tests.support.tinker_service import KEY, OTHER_KEY, run_client, running_service

pytest.importorskip("tinker", reason="the official tinker SDK (a dev dependency on Python >= 3.11)")
pytestmark = [pytest.mark.slow, pytest.mark.server]
LIMIT_MB = 0.25  # 262144 bytes


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The service with a 256 KiB body limit."""
    with running_service(tmp_path_factory.mktemp("serve"), limits=ServeLimits(max_request_mb=LIMIT_MB)) as server:
        yield server


def _raw(server, head: bytes, body: bytes = b"") -> tuple[int, bytes, float]:
    """Send a request head (and what of the body is given) and read the answer; its status, body and seconds."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head + b"\r\n" + body)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer) < answer.index(b"\r\n\r\n") + 4 + _length(answer):
            part = sock.recv(65536)
            if not part:
                break
            answer += part
    status = int(answer.split(b" ", 2)[1])
    return status, answer.split(b"\r\n\r\n", 1)[1], time.monotonic() - start


def _length(answer: bytes) -> int:
    for line in answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def test_requests_without_the_key_are_refused_before_their_body_is_read(small):
    url = f"{small.url}/api/v1/create_session"
    for headers in ({}, {"X-API-Key": "tml-not-a-key-of-this-service"}, {"X-API-Key": KEY + "x"}):
        answer = httpx.post(url, json={"tags": []}, headers=headers)
        assert answer.status_code == 401 and "missing or unknown API key" in answer.json()["detail"], headers
    # a head that declares a GiB and sends none of it: answered at once, nothing waited for
    status, body, seconds = _raw(
        small, b"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n"
    )
    assert status == 401 and b"unknown API key" in body and seconds < 10
    # the SDK with a key the service was not started with
    found = run_client(small, "refused", key="tml-a-key-it-was-not-given")
    kind, message = found["error"]
    assert kind == "AuthenticationError" and "missing or unknown API key" in message


def test_bodies_past_the_limit_are_refused_however_they_arrive(small):
    import zstandard

    limit = int(LIMIT_MB * 2**20)
    head = f"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY}\r\nContent-Type: application/json\r\n"
    # declared past the limit: refused from the head, the body never sent
    status, body, seconds = _raw(small, (head + f"Content-Length: {limit + 1}\r\n").encode())
    assert status == 413 and b"larger than 0.25 MiB" in body and seconds < 10
    # streamed in chunks with no length declared: refused once past the limit
    chunk = b'{"pad": "' + b"a" * 65536
    stream = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(5))  # 5 x 64 KiB > 256 KiB
    status, body, _ = _raw(small, (head + "Transfer-Encoding: chunked\r\n").encode(), stream)
    assert status == 413 and b"larger than 0.25 MiB" in body
    # small on the wire, past the limit once inflated
    bomb = zstandard.ZstdCompressor().compress(b'{"tags": ["' + b"a" * (2 * limit) + b'"]}')
    assert len(bomb) < limit // 100
    answer = httpx.post(
        f"{small.url}/api/v1/create_session",
        content=bomb,
        headers={"X-API-Key": KEY, "Content-Type": "application/json", "Content-Encoding": "zstd"},
    )
    assert answer.status_code == 413 and "larger than 0.25 MiB" in answer.json()["detail"]
    # the SDK's forward_backward of 40000 tokens (~400 KB of protobuf): 413, and the client's next request works
    from lightning_rl.core.models import TINY_MODEL_PATH

    result = run_client(small, "oversized", model=TINY_MODEL_PATH, tokens=40_000)
    kind, message, status = result["refused"]
    assert status == 413 and kind == "APIStatusError" and "larger than 0.25 MiB" in message
    assert result["small"]["loss:sum"] > 0


def test_one_key_cannot_read_or_write_another_keys_weights(small):
    from lightning_rl.core.models import TINY_MODEL_PATH

    mine = run_client(small, "owner", model=TINY_MODEL_PATH, key=KEY)
    assert mine["state"].startswith("tinker://") and mine["model_id"] in small.service.models
    found = run_client(small, "trespass", key=OTHER_KEY, state=mine["state"], sampler_path=mine["sampler_path"])
    for name, (kind, message) in found.items():
        assert kind == "NotFoundError" and "for this API key" in message, (name, message)
    # the owner's training client by its id, with the other key: every call on it is a 404
    other = {"X-API-Key": OTHER_KEY}
    for route, body in [
        ("get_info", {"model_id": mine["model_id"]}),
        ("optim_step", {"model_id": mine["model_id"], "adam_params": {"learning_rate": 1.0}, "seq_id": 99}),
        ("save_weights", {"model_id": mine["model_id"], "path": "stolen", "seq_id": 99}),
        ("load_weights", {"model_id": mine["model_id"], "path": mine["state"], "seq_id": 99}),
        ("save_weights_for_sampler", {"model_id": mine["model_id"], "path": "stolen", "seq_id": 99}),
    ]:
        answer = httpx.post(f"{small.url}/api/v1/{route}", json=body, headers=other)
        assert answer.status_code == 404 and "for this API key" in answer.json()["detail"], (route, answer.text)
    assert small.service.models[mine["model_id"]].steps == 1  # untouched
