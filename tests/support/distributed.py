"""Launching the multi-process runs the distributed, GPU and LoRA tests compare."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import pythonpath
from tests.lightning_rl.cli_runs import run_cli

SEEDED = [
    "--model.rollout=tests.lightning_rl.dist_probe.SeededRollout",
    "--model.rollout.group_size=4",
    "--model.rollout.max_new_tokens=6",
    "--model.rollout.temperature=3.0",
    "--model.reward=components.reward.FunctionReward",
    "--model.reward.fn=tests.lightning_rl.rewards.digit_count",
]

REPO = Path(__file__).resolve().parents[2]


def probe_args(root: Path, model_path: str, devices: int, batch_size: int, steps: int = 2) -> list[str]:
    """A run of ``steps`` iterations on 64 built-in prompts (tokenising all 9,500 costs seconds per process)."""
    from lightning_rl.data.tasks import arithmetic_rows

    root.mkdir(parents=True, exist_ok=True)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in arithmetic_rows("train")[:64]))
    return [
        f"--model.policy.path={model_path}",
        f"--data.train_data={prompts}",
        f"--data.batch_size={batch_size}",
        "--data.val_data=null",
        f"--trainer.max_steps={steps}",
        "--trainer.accelerator=cpu",
        f"--trainer.devices={devices}",
        f"--trainer.default_root_dir={root}",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.callbacks=tests.lightning_rl.dist_probe.Probe",
        f"--trainer.callbacks.out={root / 'probe.pt'}",
    ]


def no_checkpoints() -> list[str]:
    return ["--trainer.enable_checkpointing=false"]


def every_step_checkpoints(root: Path) -> list[str]:
    return [
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        f"--trainer.callbacks.dirpath={root / 'checkpoints'}",
        "--trainer.callbacks.every_n_train_steps=1",
        "--trainer.callbacks.save_top_k=-1",
        "--trainer.callbacks.filename={step}",
    ]


def launch(config: str, args: list[str], timeout: int = 240) -> dict:
    """Train in a fresh process group (Lightning spawns the other ranks); returns what the Probe saved."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": pythonpath(),
    }
    cmd = [sys.executable, "-m", "tests.lightning_rl.dist_probe", "fit", "--config", config, *args]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return torch.load(
        Path(args[args.index("--trainer.callbacks=tests.lightning_rl.dist_probe.Probe") + 1].split("=", 1)[1]),
        weights_only=False,
    )


def one_process(config: str, args: list[str]) -> dict:
    run_cli("fit", ["--config", config, *args])
    return torch.load(
        Path(args[args.index("--trainer.callbacks=tests.lightning_rl.dist_probe.Probe") + 1].split("=", 1)[1]),
        weights_only=False,
    )


def assert_same_training(one: dict, two: dict, tol: float = 1e-5) -> None:
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert two["rewards"] == pytest.approx(one["rewards"], abs=1e-6)  # the same global batch
    assert two["losses"] == pytest.approx(one["losses"], abs=tol)
    assert one["state"].keys() == two["state"].keys()
    for name, value in one["state"].items():
        torch.testing.assert_close(two["state"][name], value, rtol=0, atol=tol, msg=lambda m: f"{name}: {m}")
