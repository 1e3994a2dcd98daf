"""Stopping ``fit`` never loses completed iterations: last.ckpt holds the final iteration at the end of a run, and
the last completed one after an exception in a component, a Ctrl-C or a SIGTERM (lightning_rl.loop.fault)."""

from __future__ import annotations

import signal

import pytest
import torch

from lightning_rl.loop.module import RLModule

from .cli_runs import cli_args, run_cli
from .test_resume import assert_same

DENSE = ["--model.reward=components.reward.FunctionReward", "--model.rollout.init_args.temperature=3.0", "--model.rollout.init_args.group_size=4"]
RARE_CADENCE = ["--trainer.callbacks.every_n_train_steps=5", "--data.val_data=null"]  # no cadence save within these runs


def faulty(key: str, fault: str, at: int) -> list[str]:
    return [*DENSE, "--model.reward.fn=tests.lightning_rl.rewards.digit_count_then_fault", f"--model.reward.kwargs={{fault_at: {at}, key: {key}, fault: {fault}}}"]


def fit(root, model_path, steps: int, extra: list[str], ckpt_path=None):
    resume = [f"--ckpt_path={ckpt_path}"] if ckpt_path else []
    return run_cli("fit", cli_args(root, model_path, steps, *RARE_CADENCE, *extra, *resume))


def last(root) -> dict:
    return torch.load(root / "checkpoints" / "last.ckpt", weights_only=False)


def training_state(checkpoint: dict) -> dict:
    keys = ("state_dict", "optimizer_states", "rng", "optimizer_steps", "PromptDataModule", "global_step")
    return {k: checkpoint[k] for k in keys}


@pytest.mark.slow
def test_component_error_saves_the_last_completed_iteration_and_the_resumed_run_is_exact(tmp_path, tiny_model_path, monkeypatch):
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

    fit(tmp_path / "failed", tiny_model_path, 4, [*DENSE, "--model.reward.fn=tests.lightning_rl.rewards.digit_count"], ckpt_path=tmp_path / "failed" / "checkpoints" / "last.ckpt")
    assert_same(training_state(last(tmp_path / "straight")), training_state(last(tmp_path / "failed")))


@pytest.mark.slow
@pytest.mark.parametrize("fault, step", [("interrupt", 2), ("sigterm", 3)])
def test_ctrl_c_and_sigterm_save_last_ckpt_before_exiting(tmp_path, tiny_model_path, fault, step):
    """Ctrl-C in iteration 3 keeps iteration 2; a SIGTERM during iteration 3 lets it finish, then saves iteration 3."""
    sigint = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit):
            fit(tmp_path, tiny_model_path, 4, faulty(f"signal-{fault}", fault, 3))
    finally:
        signal.signal(signal.SIGINT, sigint)  # Lightning ignores further Ctrl-C while it shuts down
    assert last(tmp_path)["global_step"] == step
