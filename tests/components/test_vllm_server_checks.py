"""A vLLM server started by hand without the flags the rollout needs (components.rollout.vllm.engine.check_setup),
against a real vLLM server (the CPU build) started without ``--logprobs-mode`` and ``--weight-transfer-config``:
refused at set-up, before any request or weight group, in one line naming each missing flag; from the command line,
that one line and exit status 1 (before, its sampled log-probs at temperature 0.5 were off by 0.064 on average and fed
TIS/MIS, and a distributed push ended in 'terminate called without an active exception', status 134)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.rollout.server.settings import Servers, WeightPush

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm")]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bare_server(tmp_path_factory):
    """A real vLLM server as a hand-started one often is: no --logprobs-mode (vLLM's default: raw_logprobs) and no
    --weight-transfer-config."""
    from tests.fixtures.vllm_server import TINY_CALC, VLLMServerProcess, kill, unavailable, widen_heads

    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no real vLLM server: {reason}")
    root = tmp_path_factory.mktemp("bare-vllm")
    model = widen_heads(TINY_CALC, root / "tiny-calc-wide")
    server = VLLMServerProcess(root / "vllm.log", str(model), flags={"logprobs_mode": None,
                                                                     "weight_transfer_config": None})  # fmt: skip
    try:
        server.wait_ready()
        yield server
    finally:
        kill(server.pid)


def test_log_probs_of_the_raw_logits_are_refused_naming_the_flag(bare_server):
    from components.rollout import VLLMRollout
    from components.rollout.vllm import VLLMError
    from lightning_rl.core.models import load_tokenizer

    rollout = VLLMRollout(
        temperature=0.5, servers=Servers(urls=(bare_server.url,), backoff=0.01), weights=WeightPush(weight_sync="disk")
    )
    with pytest.raises(VLLMError) as err:
        rollout.setup(load_tokenizer(bare_server.model))
    rollout.close()
    assert str(err.value) == (
        f"vLLM server at {bare_server.url} was started without --logprobs-mode processed_logprobs (it returns "
        "raw_logprobs, not the log-probs of the distribution it samples from at the run's temperature, which the "
        "off-policy correction reads). Start it as the vLLM rollout's launch does, or set servers.launch instead of "
        "servers.urls"
    )


def test_a_distributed_push_to_a_server_without_the_transfer_engine_is_one_line_and_status_1(bare_server, tmp_path):
    command = [
        sys.executable, "-m", "lightning_rl.command", "fit",
        "--config", str(REPO / "configs/grpo.yaml"), "--config", str(REPO / "configs/rollout/vllm.yaml"),
        f"--model.rollout.init_args.servers.urls=[{bare_server.url}]", "--model.rollout.init_args.servers.launch", "null",
        f"--model.policy.path={bare_server.model}", "--data.batch_size=2", "--data.val_size=8",
        "--trainer.max_steps=2", f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false",
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert run.returncode == 1, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: vLLM server at {bare_server.url} was started without --logprobs-mode ")
    assert (
        'and --weight-transfer-config \'{"backend": "lightning_rl"}\' (it has None; weights.weight_sync: distributed'
        in last
    )
    assert "Traceback" not in run.stderr and "terminate called" not in run.stderr
