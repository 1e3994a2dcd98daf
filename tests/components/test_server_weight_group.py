"""The trainer's side of a weight group (components.rollout.server.group, components.rollout.vllm.transfer): a server
that refuses to join at once leaves the run to end with its one-line error and status 1. Before, the group's TCP
store was still starting its server thread on a daemon thread when the process exited: "terminate called without an
active exception", status 134 (round five, row 6)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

REFUSING_SERVER = textwrap.dedent(
    """
    import json, sys, threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Refusing(BaseHTTPRequestHandler):  # vLLM 0.32 started without --weight-transfer-config
        def log_message(self, *args):
            pass

        def _answer(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # /get_world_size
            self._answer(200, {"world_size": 1})

        def do_POST(self):  # /init_weight_transfer_engine
            self.rfile.read(int(self.headers["Content-Length"]))
            self._answer(500, {"error": {"message": "Weight transfer not configured. Please set "
                                         "weight_transfer_config to enable weight transfer."}})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    """
)

JOIN = textwrap.dedent(
    """
    from components.rollout.vllm.client import VLLMClient, VLLMError
    from components.rollout.vllm.transfer import TransferGroups

    try:
        TransferGroups(VLLMClient(timeout_s=600.0, max_retries=0, backoff=0.0), [url], "gloo", "127.0.0.1", None)
    except VLLMError as err:
        raise SystemExit(f"error: {err}")
    """
)


@pytest.mark.soak
@pytest.mark.slow
def test_a_server_refusing_to_join_at_once_leaves_one_line_and_status_1():
    for _ in range(5):  # the abort depended on how soon the refusal came back: a few tries
        run = subprocess.run([sys.executable, "-c", REFUSING_SERVER + JOIN], capture_output=True, text=True,
                             cwd=REPO, timeout=120)  # fmt: skip
        assert run.returncode == 1, run.stderr[-1500:]
        assert "terminate called" not in run.stderr
        assert run.stderr.strip().startswith("error: vLLM server at http://127.0.0.1:")
        assert "Weight transfer not configured" in run.stderr and len(run.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.soak  # a 25-s wait for a hang that never comes
def test_a_group_left_waiting_for_its_servers_does_not_abort_the_exit():
    """The store made on the calling thread, the rendezvous in the background, the process exiting at once: for both
    engines' groups (SGLang's through join_as_rank_zero, vLLM's through the transfer engine's _group)."""
    script = textwrap.dedent(
        """
        import sys
        from datetime import timedelta
        from components.rollout.server.group import in_background, join_as_rank_zero, master_store
        from components.rollout.server.launch import free_port
        from components.rollout.vllm.transfer import _group

        timeout = timedelta(seconds=600)
        store = master_store("127.0.0.1", free_port(), 2, timeout)
        if sys.argv[1] == "sglang":
            in_background(join_as_rank_zero, "gloo", store, 2, "g", timeout)
        else:
            in_background(_group, "gloo", "127.0.0.1", store, 2, timeout)
        raise SystemExit("error: the run's one line")
        """
    )
    for engine in ("sglang", "vllm", "sglang", "vllm"):
        run = subprocess.run([sys.executable, "-c", script, engine], capture_output=True, text=True, cwd=REPO,
                             timeout=120)  # fmt: skip
        assert (run.returncode, run.stderr.strip()) == (1, "error: the run's one line")
