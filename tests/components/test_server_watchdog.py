"""A launched server never outlives the trainer that launched it (components/rollout/server/watchdog.py): a trainer
process that launches a server (the loopback SGLang stand-in; the real vLLM server, slow) and then ends by SIGKILL,
SIGTERM, Ctrl-C or an exception leaves no process of the server's group behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.sglang_server import fake_sglang_package
from tests.helpers import pythonpath
from tests.support.processes import as_from_a_terminal, gone_within, group_alive

REPO = Path(__file__).resolve().parents[2]

TRAINER = """
import faulthandler, json, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for the stacks of a trainer that does not end
from lightning_rl.core.models import load_tokenizer
import components.rollout as rollouts
from components.rollout.server.settings import Servers, Verification, WeightPush
engine, model, how, launch = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
rollout = getattr(rollouts, engine)(
    servers=Servers(launch=launch), weights=WeightPush(sync_before_first_rollout=False), verify=Verification(every=0)
)
rollout.setup(load_tokenizer(model))
print(rollout.connection.server.process.pid, flush=True)
if how == "exception":
    sys.stdin.readline()  # once the test has seen the server running
    raise RuntimeError("a component failed")
time.sleep(600)
"""


def launch_and_end(tmp_path: Path, engine: str, model: str, launch: dict, how: str, start_s: float) -> int:
    """Run a trainer that launches a server, end it ``how``; the server's process group."""
    env = {**os.environ, "PYTHONPATH": pythonpath(tmp_path), "OMP_NUM_THREADS": "1"}
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, engine, model, how, json.dumps(launch)],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_from_a_terminal,
    )
    try:
        line = trainer.stdout.readline()
        if not line.strip().isdigit():
            trainer.kill()
            raise AssertionError(f"the trainer did not launch its server: {line}{trainer.communicate()[1][-3000:]}")
        group = int(line)
        assert group_alive(group), "the server runs while its trainer does"
        if how == "exception":
            trainer.stdin.write("\n")
            trainer.stdin.flush()
        else:
            trainer.send_signal({"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigint": signal.SIGINT}[how])
        try:
            trainer.wait(timeout=start_s)
        except subprocess.TimeoutExpired:
            trainer.send_signal(signal.SIGUSR1)  # every thread's stack, on its stderr
            time.sleep(2)
            trainer.kill()
            stderr = trainer.communicate()[1]
            raise AssertionError(f"the trainer ({how}) had not ended after {start_s} s; its stderr:\n{stderr[-6000:]}")
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    return group


@pytest.mark.slow  # a trainer process and its server each: ~30 s (the fast row: test_fault_matrix.py::test_trainer_killed)
@pytest.mark.parametrize("how", ["sigkill", "sigterm", "sigint", "exception"])
def test_no_launched_sglang_server_outlives_its_trainer(tmp_path, tiny_model_path, how):
    fake_sglang_package(tmp_path)
    group = launch_and_end(tmp_path, "SGLangRollout", tiny_model_path, {"model_path": tiny_model_path}, how, 60)
    assert gone_within(group, 15) == []


@pytest.mark.soak
@pytest.mark.slow
def test_no_launched_vllm_server_outlives_a_sigkilled_trainer(tmp_path):
    from tests.fixtures.vllm_server import SERVER_ARGS, TINY_CALC, unavailable, widen_heads

    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no real vLLM server: {reason}")
    model = str(widen_heads(TINY_CALC, tmp_path / "tiny-calc-wide"))
    group = launch_and_end(tmp_path, "VLLMRollout", model, dict(SERVER_ARGS, model=model), "sigkill", 60)
    assert gone_within(group, 30) == []  # the API server, its engine core and worker
