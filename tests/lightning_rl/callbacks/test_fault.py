"""Stopping ``fit`` never loses completed iterations: last.ckpt holds the final iteration at the end of a run, and
the last completed one after an exception in a component, a Ctrl-C or a SIGTERM (lightning_rl.callbacks.fault), also when an
asynchronous agent run is stuck in a tool call."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lightning_rl.loop.module import RLModule
from tests.lightning_rl.cli_runs import cli_args, run_cli
from tests.support.processes import as_from_a_terminal
from tests.support.resume import assert_same

DENSE = [
    "--model.reward=components.reward.FunctionReward",
    "--model.rollout.init_args.temperature=3.0",
    "--model.rollout.init_args.group_size=4",
]
RARE_CADENCE = [
    "--trainer.callbacks.every_n_train_steps=5",
    "--data.val_data=null",
]  # no cadence save within these runs


def faulty(key: str, fault: str, at: int) -> list[str]:
    return [
        *DENSE,
        "--model.reward.fn=tests.lightning_rl.rewards.digit_count_then_fault",
        f"--model.reward.kwargs={{fault_at: {at}, key: {key}, fault: {fault}}}",
    ]


def fit(root, model_path, steps: int, extra: list[str], ckpt_path=None):
    resume = [f"--ckpt_path={ckpt_path}"] if ckpt_path else []
    return run_cli("fit", cli_args(root, model_path, steps, *RARE_CADENCE, *extra, *resume))


def last(root) -> dict:
    return torch.load(root / "checkpoints" / "last.ckpt", weights_only=False)


def training_state(checkpoint: dict) -> dict:
    keys = ("state_dict", "optimizer_states", "rng", "optimizer_steps", "PromptDataModule", "global_step")
    return {k: checkpoint[k] for k in keys}


@pytest.mark.slow
def test_component_error_saves_the_last_completed_iteration_and_the_resumed_run_is_exact(
    tmp_path, tiny_model_path, monkeypatch
):
    """The reward fails in iteration 3 of 4 with no cadence save so far: last.ckpt holds iteration 2, and resuming from it
    (to the end of fit, which saves iteration 4 though 4 is not a multiple of every_n_train_steps=5) equals a straight run."""
    fit(tmp_path / "straight", tiny_model_path, 4, [*DENSE, "--model.reward.fn=tests.lightning_rl.rewards.digit_count"])
    assert last(tmp_path / "straight")["global_step"] == 4  # end of fit, off the cadence

    closed = []  # the module's teardown closes the rollout (an SGLang server, its weights folder); Lightning skips it on errors
    teardown = RLModule.teardown
    monkeypatch.setattr(RLModule, "teardown", lambda self, stage: (closed.append(stage), teardown(self, stage)))
    with pytest.raises(RuntimeError, match="reward server went away"):
        fit(tmp_path / "failed", tiny_model_path, 4, faulty("component", "error", 3))
    assert closed == ["fit"]
    monkeypatch.undo()
    saved = last(tmp_path / "failed")
    assert saved["global_step"] == 2 and saved["PromptDataModule"]["position"]["batch"] == 2

    fit(
        tmp_path / "failed",
        tiny_model_path,
        4,
        [*DENSE, "--model.reward.fn=tests.lightning_rl.rewards.digit_count"],
        ckpt_path=tmp_path / "failed" / "checkpoints" / "last.ckpt",
    )
    assert_same(training_state(last(tmp_path / "straight")), training_state(last(tmp_path / "failed")))


@pytest.mark.slow
def test_a_failure_after_the_update_saves_that_iteration_and_the_resumed_run_is_exact(
    tmp_path, tiny_model_path, monkeypatch
):
    """The weight push after iteration 3's update fails (a server that died after iteration 2), no cadence save so far:
    iteration 3's optimizer steps are done, so last.ckpt holds iteration 3 (before: none was written, and iterations
    1-3 were lost although their updates completed), and resuming from it equals a straight run."""
    from components.rollout import HFRollout

    dense = [*DENSE, "--model.reward.fn=tests.lightning_rl.rewards.digit_count"]
    fit(tmp_path / "straight", tiny_model_path, 4, dense)

    pushes = []
    sync = HFRollout.sync_weights

    def dies_at_the_third_push(self, policy):
        pushes.append(1)
        if len(pushes) == 3:
            raise RuntimeError("the server at http://gen1:30000 went away")
        sync(self, policy)

    monkeypatch.setattr(HFRollout, "sync_weights", dies_at_the_third_push)
    with pytest.raises(RuntimeError, match="went away"):
        fit(tmp_path / "failed", tiny_model_path, 4, dense)
    monkeypatch.undo()
    saved = last(tmp_path / "failed")
    assert saved["global_step"] == 3 and saved["PromptDataModule"]["position"]["batch"] == 3

    fit(tmp_path / "failed", tiny_model_path, 4, dense, ckpt_path=tmp_path / "failed" / "checkpoints" / "last.ckpt")
    assert_same(training_state(last(tmp_path / "straight")), training_state(last(tmp_path / "failed")))


ASYNC = ["--config", str(Path(__file__).resolve().parents[3] / "configs/loop/async.yaml"),
         "--model.rollout.init_args.return_logprobs=true"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault, loop, step, status",
    [("interrupt", "sync", 2, 1), ("sigterm", "sync", 3, 143), ("sigterm", "async", 3, 143)],
)
def test_ctrl_c_and_sigterm_save_last_ckpt_before_exiting(tmp_path, tiny_model_path, fault, loop, step, status):
    """Ctrl-C in iteration 3 keeps iteration 2, exit status 1; a SIGTERM during iteration 3 lets it finish, saves
    iteration 3, then exits with status 143 (128 + SIGTERM), in the synchronous and the asynchronous loop: a scheduler
    that pre-empted the run must not read it as a success (Lightning's SIGTERMException exits with 0)."""
    sigint = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as ended:
            fit(
                tmp_path,
                tiny_model_path,
                4,
                [*faulty(f"signal-{fault}-{loop}", fault, 3), *(ASYNC if loop == "async" else [])],
            )
    finally:
        signal.signal(signal.SIGINT, sigint)  # Lightning ignores further Ctrl-C while it shuts down
    assert ended.value.code == status
    assert last(tmp_path)["global_step"] == step


HANGING_TOOL = """
model:
  rollout: {{init_args: {{group_size: 4, return_logprobs: true}}}}
  agent:
    init_args:
      env:
        init_args:
          tools:
            - class_path: components.env.FunctionTool
              init_args: {{fn: tests.fixtures.tools.calc_or_hang, name: calc, timeout_s: 120.0}}
data: {{batch_size: 2, val_size: 4}}
trainer:
  max_steps: 500
  val_check_interval: null
  default_root_dir: {root}
  logger: false
  enable_progress_bar: false
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{dirpath: {root}/checkpoints, save_last: true, every_n_train_steps: 1, save_top_k: 0}}
"""


def _wait_for(path: Path, process: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.poll() is None, f"the run ended (exit {process.returncode}) before {path.name} appeared"
        assert time.monotonic() < deadline, f"no {path.name} after {seconds} s"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum", [pytest.param(signal.SIGINT, marks=pytest.mark.soak), signal.SIGTERM]
)  # SIGTERM in make test
def test_an_interrupt_ends_an_asynchronous_agent_run_stuck_in_a_tool(tmp_path, signum):
    """configs/agent_calc.yaml + configs/loop/async.yaml with a calculator tool that, once the run has saved an iteration,
    never returns (on the rollout-ahead thread): Ctrl-C and SIGTERM still end the process, with last.ckpt saved."""
    repo = Path(__file__).resolve().parents[3]
    overlay, marker, log = tmp_path / "hanging_tool.yaml", tmp_path / "hang", tmp_path / "log.txt"
    overlay.write_text(HANGING_TOOL.format(root=tmp_path))
    command = [
        sys.executable,
        "-m",
        "lightning_rl.cli",
        "fit",
        "--config",
        "configs/agent_calc.yaml",
        "--config",
        "configs/loop/async.yaml",
        "--config",
        str(overlay),
    ]
    with open(log, "wb") as out:
        run = subprocess.Popen(
            command,
            cwd=repo,
            env={**os.environ, "HANG_MARKER": str(marker)},
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=as_from_a_terminal,
        )
    try:
        _wait_for(tmp_path / "checkpoints" / "last.ckpt", run, 300.0)
        marker.touch()  # from now on every tool call hangs
        # the shipped policy calls the tool on about a third of the problems (8 episodes an iteration); the tool's
        # timeout is long enough (120 s) that a worker started on a loaded machine gets as far as the call
        _wait_for(Path(f"{marker}.hung"), run, 120.0)
        run.send_signal(signum)
        start = time.monotonic()
        try:
            run.wait(timeout=100.0)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not end within 100 s of the signal; its log ends: {log.read_text()[-1500:]}")
        assert time.monotonic() - start < 100.0  # before the stuck call's timeout (120 s) would have ended it
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] >= 1


HANGING_AGENT = """
model:
  rollout: {{init_args: {{group_size: 2}}}}
  agent: {{init_args: {{function: tests.support.endpoint.calc_agent_or_hang, timeout_s: 600}}}}
data: {{batch_size: 2, val_size: 4}}
trainer:
  max_steps: 500
  val_check_interval: null
  default_root_dir: {root}
  logger: false
  enable_progress_bar: false
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{dirpath: {root}/checkpoints, save_last: true, every_n_train_steps: 1, save_top_k: 0}}
"""


@pytest.mark.slow
def test_sigterm_ends_a_synchronous_openai_agent_round_at_once(tmp_path):
    """configs/openai_agent.yaml with an agent that, once the run has saved an iteration, never returns (timeout_s 600):
    a SIGTERM ends the round under way at once (RoundInterrupted) and the process exits with last.ckpt at the last
    completed iteration; before, Lightning waited for the iteration to end, i.e. for every episode's timeout_s."""
    repo = Path(__file__).resolve().parents[3]
    overlay, marker, log = tmp_path / "hanging_agent.yaml", tmp_path / "hang", tmp_path / "log.txt"
    overlay.write_text(HANGING_AGENT.format(root=tmp_path))
    command = [sys.executable, "-m", "lightning_rl.cli", "fit", "--config", "configs/openai_agent.yaml"]
    with open(log, "wb") as out:
        run = subprocess.Popen(
            [*command, "--config", str(overlay)],
            cwd=repo,
            env={**os.environ, "HANG_MARKER": str(marker)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for(tmp_path / "checkpoints" / "last.ckpt", run, 300.0)
        marker.touch()
        _wait_for(Path(f"{marker}.hung"), run, 120.0)
        saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
        run.send_signal(signal.SIGTERM)
        start = time.monotonic()
        try:
            run.wait(timeout=60.0)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not end within 60 s of SIGTERM; its log ends: {log.read_text()[-1500:]}")
        assert time.monotonic() - start < 30.0
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    text = log.read_text()
    assert "agents: SIGTERM while 4 episodes sampled: the round was ended at once and is not trained" in text, text[
        -1500:
    ]
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] >= saved >= 1
