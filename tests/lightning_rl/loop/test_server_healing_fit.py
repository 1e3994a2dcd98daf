"""A 10-iteration fit whose launched server is killed (kill -9) in the middle: it finishes all 10 iterations, logs one
restart (``servers/restarts``), every push after it verified; on the real vLLM server (one, launched) and on two
launched loopback SGLang servers, where the other keeps sampling while one restarts."""

from __future__ import annotations

import json
import os
import signal

import pytest

from components.rollout.server.checks import Checks
from components.rollout.server.rollout import ServerRollout
from tests.fixtures.sglang_server import fake_sglang_package
from tests.helpers import pythonpath
from tests.lightning_rl.cli_runs import cli_args, run_cli, scalars
from tests.support.engines import MODEL, REPO

pytestmark = [pytest.mark.slow, pytest.mark.server, pytest.mark.xdist_group("vllm")]


def _fit_with_a_kill(tmp_path, monkeypatch, model: str, rollout_args: list[str], kill_at: int = 5) -> dict:
    seen = {"generates": 0, "pushes_after": 0, "verified_after": 0, "pending_after_retry": None}
    generate, sync, after_push = ServerRollout.generate, ServerRollout.sync_weights, Checks.after_push

    def generating(self, prompts, policy, params=None):
        seen["generates"] += 1
        if seen["generates"] == kill_at:  # in the middle of the run, as this iteration's rollout starts
            os.killpg(self.connection.launched[0].process.pid, signal.SIGKILL)
        batch = generate(self, prompts, policy, params)
        if seen["generates"] == kill_at:
            seen["pending_after_retry"] = dict(self.healing.pending)
        return batch

    def syncing(self, policy):
        if seen["generates"] >= kill_at:
            seen["pushes_after"] += 1
        return sync(self, policy)

    def checking(self, *args, **kwargs):
        if seen["generates"] >= kill_at:
            seen["verified_after"] += 1
        return after_push(self, *args, **kwargs)

    monkeypatch.setattr(ServerRollout, "generate", generating)
    monkeypatch.setattr(ServerRollout, "sync_weights", syncing)
    monkeypatch.setattr(Checks, "after_push", checking)
    extra = [*rollout_args, "--model.rollout.init_args.servers.urls=[]", "--model.rollout.init_args.verify.every=1",
             "--model.rollout.init_args.servers.backoff=0.05", "--trainer.limit_val_batches=0",
             "--model.reward=components.reward.FunctionReward", "--model.reward.fn=tests.lightning_rl.rewards.digit_count",
             "--model.rollout.init_args.temperature=2.0"]  # fmt: skip
    cli = run_cli("fit", cli_args(tmp_path, model, 10, *extra))
    assert cli.trainer.global_step == 10
    assert cli.model.rollout.healing.restarts == 1
    assert [v for _, v in scalars(tmp_path)["servers/restarts"]][-1] == 1.0
    assert seen["pushes_after"] >= 1 and seen["verified_after"] >= seen["pushes_after"]  # every push after, verified
    return seen


@pytest.mark.soak  # make test keeps the in-fit kill on two SGLang servers and vLLM's max_restarts stop
def test_a_launched_vllm_server_killed_mid_run(tmp_path, monkeypatch, capfd):
    from tests.fixtures.vllm_server import SERVER_ARGS, TINY_CALC, unavailable, widen_heads

    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no real vLLM server: {reason}")
    model = str(widen_heads(TINY_CALC, tmp_path / "tiny-calc-wide"))
    launch = json.dumps(dict(SERVER_ARGS, model=model))
    _fit_with_a_kill(
        tmp_path, monkeypatch, model,
        ["--config", str(REPO / "configs/rollout/vllm.yaml"), f"--model.rollout.init_args.servers.launch={launch}"],
    )  # fmt: skip
    assert capfd.readouterr().err.count("restarting the vLLM server") == 1


def test_two_launched_sglang_servers_one_killed_mid_run(tmp_path, monkeypatch, capfd):
    fake_sglang_package(tmp_path)
    monkeypatch.setenv("PYTHONPATH", pythonpath(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    launch = json.dumps({"model_path": MODEL})
    seen = _fit_with_a_kill(
        tmp_path, monkeypatch, MODEL,
        ["--config", str(REPO / "configs/rollout/sglang.yaml"), f"--model.rollout.init_args.servers.launch={launch}",
         "--model.rollout.init_args.servers.launch_servers=2"],
    )  # fmt: skip
    assert len(seen["pending_after_retry"]) == 1  # the retried rollout sampled on the other while this one started
    assert capfd.readouterr().err.count("restarting the SGLang server") == 1


def test_past_max_restarts_the_run_stops_with_a_checkpoint_that_resumes(tmp_path, monkeypatch):
    import torch

    fake_sglang_package(tmp_path)
    monkeypatch.setenv("PYTHONPATH", pythonpath(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    generate, calls = ServerRollout.generate, []

    def generating(self, prompts, policy, params=None):
        calls.append(1)
        if len(calls) == 4:  # iteration 4 (0-based 3): after the checkpoint of iteration 2, before that of 4
            os.killpg(self.connection.launched[0].process.pid, signal.SIGKILL)
        return generate(self, prompts, policy, params)

    monkeypatch.setattr(ServerRollout, "generate", generating)
    args = ["--config", str(REPO / "configs/rollout/sglang.yaml"), "--model.rollout.init_args.servers.urls=[]",
            f"--model.rollout.init_args.servers.launch={json.dumps({'model_path': MODEL})}",
            "--model.rollout.init_args.servers.max_restarts=0", "--model.rollout.init_args.servers.backoff=0.05",
            "--trainer.limit_val_batches=0"]  # fmt: skip
    with pytest.raises(Exception, match=r"\(0 of max_restarts=0\); the run stops here"):
        run_cli("fit", cli_args(tmp_path, MODEL, 6, *args))
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 3  # the iterations completed before the server went down
    monkeypatch.setattr(ServerRollout, "generate", generate)
    cli = run_cli("fit", [*cli_args(tmp_path, MODEL, 6, *args), f"--ckpt_path={tmp_path}/checkpoints/last.ckpt"])
    assert cli.trainer.global_step == 6
