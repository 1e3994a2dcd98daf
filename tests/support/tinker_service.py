"""`lightning-rl serve` for the service's tests: started in the test's process (so a test can look at the models it
holds), its clients run in other processes with the official SDK (`tests.support.tinker_clients`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
KEY, OTHER_KEY = "tml-test-key-one", "tml-test-key-two"


@contextmanager
def running_service(checkpoint_dir: Path, **settings):
    """The service on a free loopback port with two keys; torch's thread count as it was after."""
    from lightning_rl.core.models import TINY_MODEL_PATH
    from lightning_rl.service import ServeConfig, serve

    threads = torch.get_num_threads()
    config = dict(base_models=[TINY_MODEL_PATH], api_keys=[KEY, OTHER_KEY], port=0, threads=1)
    server = serve(ServeConfig(checkpoint_dir=str(checkpoint_dir), **{**config, **settings})).start()
    try:
        yield server
    finally:
        server.stop()
        torch.set_num_threads(threads)


def client_env(server, key: str = KEY) -> dict:
    return {**os.environ, "TINKER_BASE_URL": server.url, "TINKER_API_KEY": key, "PYTHONUNBUFFERED": "1"}


def client_command(name: str, **arguments) -> list[str]:
    return [sys.executable, "-m", "tests.support.tinker_clients", name, json.dumps(arguments)]


def run_client(server, name: str, key: str = KEY, timeout: float = 600, **arguments) -> dict:
    """Run the SDK client ``name`` in another process; its ``RESULT`` JSON."""
    done = subprocess.run(
        client_command(name, **arguments), cwd=ROOT, env=client_env(server, key), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise AssertionError(f"the SDK client {name} failed ({done.returncode}):\n{done.stderr[-4000:]}")


@contextmanager
def serve_command(checkpoint_dir: Path, key: str, *flags: str):
    """`lightning-rl serve` on the tiny policy as a process of its own, on a port the OS picks; its URL. Stopped (its
    process group killed) on the way out."""
    from lightning_rl.core.models import TINY_MODEL_PATH

    command = [
        sys.executable, "-m", "lightning_rl.command", "serve", "--base_models", TINY_MODEL_PATH, "--api_keys", key,
        "--port", "0", "--threads", "1", "--checkpoint_dir", str(checkpoint_dir), *flags,
    ]  # fmt: skip
    server = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        lines = []
        for line in server.stdout:
            lines.append(line)
            if line.startswith("lightning-rl serve: the Tinker API on "):
                threading.Thread(target=lines.extend, args=(server.stdout,), daemon=True).start()  # keep it drained
                yield line.split(" on ", 1)[1].split()[0]
                break
        else:
            raise AssertionError("lightning-rl serve did not start:\n" + "".join(lines[-40:]))
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        server.stdout.close()
