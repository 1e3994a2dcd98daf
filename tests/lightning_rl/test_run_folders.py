"""Each fit gets its own run folder, claimed atomically; nothing of a run is overwritten by a later command; a run's own
checkpoint continues that run; TensorBoard sees each run once; runs/<name>/latest/checkpoints reaches the newest run's."""

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import pythonpath

from .cli_runs import cli_args, run_cli

REPO = Path(__file__).parents[2]


def _args(root, model_path, steps, *extra):
    # the presets' layout (runs/grpo/checkpoints) under a logger renamed to exp_a: the checkpoints must follow the logger
    return cli_args(
        root,
        model_path,
        steps,
        "--data.val_data=null",
        "--trainer.logger.name=exp_a",
        f"--trainer.callbacks.dirpath={root}/grpo/checkpoints",
        *extra,
    )


def _step(path) -> int:
    return torch.load(path, weights_only=False)["global_step"]


def _tensorboard_runs(root) -> list[str]:
    """The runs TensorBoard lists under ``tensorboard --logdir root`` (its own directory walk)."""
    from tensorboard.backend.event_processing import io_wrapper

    return sorted(str(Path(d).relative_to(root)) for d in io_wrapper.GetLogdirSubdirectories(str(root)))


@pytest.mark.slow
def test_a_renamed_run_twice_keeps_both_runs_checkpoints_and_tensorboard_sees_each_once(tmp_path, tiny_model_path):
    run_cli("fit", _args(tmp_path, tiny_model_path, 2))
    run_cli("fit", _args(tmp_path, tiny_model_path, 3))
    runs = tmp_path / "exp_a"
    assert sorted(p.name for p in runs.iterdir()) == ["latest", "version_0", "version_1"]
    assert _step(runs / "version_0" / "checkpoints" / "last.ckpt") == 2  # the first run's, not overwritten
    assert _step(runs / "version_1" / "checkpoints" / "last.ckpt") == 3
    assert _step(runs / "latest" / "checkpoints" / "last.ckpt") == 3  # the newest run's
    assert not (tmp_path / "grpo").exists()  # the preset's folder named in dirpath is not shared by the two runs
    assert yaml.safe_load((runs / "latest" / "config.yaml").read_text())["trainer"]["max_steps"] == 3
    assert _tensorboard_runs(tmp_path) == ["exp_a/version_0", "exp_a/version_1"]  # `latest` is not a third run


_GATED_FIT = """
import os, sys, time
from lightning.pytorch.loggers import TensorBoardLogger
import lightning_rl.cli.commands as cli
gates, args = sys.argv[1], sys.argv[2:]

def meet(gate):  # wait (at most a minute) until both processes are here
    os.makedirs(os.path.join(gates, gate), exist_ok=True)
    open(os.path.join(gates, gate, str(os.getpid())), "w").close()
    deadline = time.time() + 60
    while len(os.listdir(os.path.join(gates, gate))) < 2 and time.time() < deadline:
        time.sleep(0.001)

run, next_version = cli.RLCLI._run_subcommand, TensorBoardLogger._get_next_version
def gated_run(self, subcommand):  # both processes start fit at the same moment
    meet("fit")
    run(self, subcommand)
def gated_next_version(self):  # and, where the logger picks its own version, both look before either creates it
    version = next_version(self)
    meet("version")
    return version
cli.RLCLI._run_subcommand, TensorBoardLogger._get_next_version = gated_run, gated_next_version
cli.main(["fit", *args])
"""


@pytest.mark.slow
@pytest.mark.soak  # make test keeps the claim's unit tests
def test_two_fits_started_together_claim_different_versions(tmp_path, tiny_model_path):
    gate = tmp_path / "gates"
    args = _args(tmp_path, tiny_model_path, 1, f"--trainer.callbacks.dirpath={tmp_path}/exp_a/checkpoints")
    fits = [
        subprocess.Popen(
            [sys.executable, "-c", _GATED_FIT, str(gate), *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    for fit in fits:
        out, _ = fit.communicate(timeout=300)
        assert fit.returncode == 0, out[-3000:]
    runs = tmp_path / "exp_a"
    assert sorted(p.name for p in runs.glob("version_*")) == ["version_0", "version_1"]
    for version in runs.glob("version_*"):
        assert len(list(version.glob("events.out.tfevents.*"))) == 1  # one process per folder
        assert _step(version / "checkpoints" / "last.ckpt") == 1


@pytest.mark.slow
def test_resuming_a_runs_checkpoint_through_latest_continues_that_run(tmp_path, tiny_model_path, caplog):
    from .cli_runs import scalars

    run_cli("fit", _args(tmp_path, tiny_model_path, 2))
    runs = tmp_path / "exp_a"
    config = (runs / "version_0" / "config.yaml").read_text()
    # the resume command of docs/getting-started.md: --ckpt_path through latest/, read before anything moves
    run_cli("fit", _args(tmp_path, tiny_model_path, 4, f"--ckpt_path={runs}/latest/checkpoints/last.ckpt"))
    assert sorted(p.name for p in runs.iterdir()) == ["latest", "version_0"]  # the same run, not a new version
    assert _step(runs / "version_0" / "checkpoints" / "last.ckpt") == 4
    assert [step for step, _ in scalars(tmp_path, "exp_a")["reward/mean"]] == [0, 1, 2, 3]  # steps continue in one run
    assert len(list((runs / "version_0").glob("events.out.tfevents.*"))) == 2  # a new event file beside the first
    assert (runs / "version_0" / "config.yaml").read_text() == config  # written once, by the fit that started the run
    assert "max_steps: 4" in (runs / "version_0" / "resume_config.yaml").read_text()
    assert "Continuing the run in" in caplog.text
    assert _tensorboard_runs(tmp_path) == ["exp_a/version_0"]

    run_cli("fit", _args(tmp_path, tiny_model_path, 5, f"--ckpt_path={runs}/latest/checkpoints/last.ckpt", "--new_run"))
    assert sorted(p.name for p in runs.iterdir()) == ["latest", "version_0", "version_1"]  # asked for a new run
    assert (
        _step(runs / "version_1" / "checkpoints" / "last.ckpt") == 5
        and _step(runs / "version_0" / "checkpoints" / "last.ckpt") == 4
    )
    assert _step(runs / "latest" / "checkpoints" / "last.ckpt") == 5


@pytest.mark.slow
def test_continuing_a_run_with_another_policy_path_is_refused_naming_both(tmp_path, tiny_model_path, tiny_model_path_b):
    """The policy's path gives a run its tokenizer and (without model.reference) its KL reference: a resume that names
    another is refused before anything is written or loaded; the same folder written another way continues the run;
    --new_run starts a new run from the weights."""
    from lightning_rl.core.errors import ConfigError

    run_cli("fit", _args(tmp_path, tiny_model_path, 2))
    runs = tmp_path / "exp_a"
    resume = f"--ckpt_path={runs}/latest/checkpoints/last.ckpt"
    with pytest.raises(ConfigError) as refused:
        run_cli("fit", _args(tmp_path, tiny_model_path_b, 4, resume))
    assert str(refused.value) == (
        f"--ckpt_path {runs}/version_0/checkpoints/last.ckpt was trained from model.policy.path {tiny_model_path!r}, "
        f"and this run gives {tiny_model_path_b!r}: the policy's path also gives the run its tokenizer and (without "
        f"model.reference) its KL reference. Give --model.policy.path {tiny_model_path}, or --new_run to start a new "
        "run from these weights"
    )
    assert not (runs / "version_0" / "resume_config.yaml").exists()
    assert len(list((runs / "version_0").glob("events.out.tfevents.*"))) == 1  # nothing recorded
    run_cli("fit", _args(tmp_path, f"{tiny_model_path}/", 3, resume))  # the same folder
    assert _step(runs / "version_0" / "checkpoints" / "last.ckpt") == 3
    run_cli("fit", _args(tmp_path, tiny_model_path_b, 4, resume, "--new_run"))
    assert _step(runs / "version_1" / "checkpoints" / "last.ckpt") == 4


@pytest.mark.slow
def test_validate_never_overwrites_the_runs_config_and_leaves_nothing_without_a_logger(tmp_path, tiny_model_path):
    args = cli_args(
        tmp_path, tiny_model_path, 2, f"--trainer.callbacks.dirpath={tmp_path}/run/checkpoints", "--data.val_size=4"
    )
    run_cli("fit", [*args, "--model.optimizer.lr=3e-4"])
    run = tmp_path / "run" / "version_0"
    trained = (run / "config.yaml").read_text()
    ckpt = f"--ckpt_path={tmp_path}/run/latest/checkpoints/last.ckpt"
    run_cli("validate", [*args, ckpt])
    assert (run / "config.yaml").read_text() == trained  # the record of what was trained: lr 3e-4
    assert yaml.safe_load(trained)["model"]["optimizer"]["lr"] == 3e-4
    assert (run / "validate_config.yaml").exists()  # validate's own, beside it
    run_cli("validate", [*args, ckpt])
    assert (run / "validate_config.2.yaml").exists() and (run / "config.yaml").read_text() == trained

    before = sorted(str(p) for p in tmp_path.rglob("*"))
    run_cli("validate", [*args, "--trainer.logger=false", ckpt])  # what `make run` does
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing stray


@pytest.mark.slow
def test_validation_before_after_and_validate_beside_its_fit(tmp_path, tiny_model_path, capsys):
    from .cli_runs import scalars

    args = cli_args(
        tmp_path, tiny_model_path, 3, f"--trainer.callbacks.dirpath={tmp_path}/run/checkpoints"
    )  # validates every 2
    run_cli("fit", args)
    logged = scalars(tmp_path)
    assert [step for step, _ in logged["val/reward"]] == [0, 2, 3]  # before training, every 2, after the last
    assert "epoch" not in logged and "hp_metric" not in logged
    assert {"time/rollout_s", "time/score_s"} <= set(logged)  # units in the names
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run" / "version_0"), size_guidance={"tensors": 0})
    events.Reload()
    assert "custom_scalars__config__" in events.Tags()["tensors"]  # the Custom Scalars tab: reward, val, policy, cost
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_cli("validate", [*args, f"--ckpt_path={tmp_path}/run/latest/checkpoints/last.ckpt"])
    assert not [w for w in caught if "dirpath has changed" in str(w.message)]  # the run's own folder is no news
    printed = capsys.readouterr().out  # `validate` prints and returns what it measured, though Lightning did not log it
    assert re.search(r"val/reward\s+│\s+\d(\.\d+)?\s", printed) and re.search(r"val/response_length\s+│\s+\d", printed)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["latest", "version_0"]  # no run of its own
    assert [step for step, _ in scalars(tmp_path)["val/reward"]] == [0, 2, 3, 3]  # beside the fit, at its step


def test_version_folders_are_claimed_exclusively(tmp_path):
    from lightning_rl.runs import claim_version

    (tmp_path / "version_0").mkdir()
    (tmp_path / "version_2").mkdir()
    assert claim_version(tmp_path).name == "version_3"  # after the highest, never a folder that exists
    assert claim_version(tmp_path).name == "version_4"


@pytest.mark.soak
@pytest.mark.slow
def test_two_ranks_share_one_run_folder_and_resume_it(tmp_path, tiny_model_path):
    """DDP on 2 CPU processes: only rank 0 claims a version (Lightning broadcasts its folders), and a resume through
    latest/ continues that run on both ranks."""
    import os

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath()}
    ddp = ["--config", str(REPO / "configs/strategy/ddp.yaml"), "--trainer.accelerator=cpu", "--trainer.devices=2"]

    def fit(steps, *extra):
        args = [
            a
            for a in _args(tmp_path, tiny_model_path, steps, *extra)
            if not a.startswith("--trainer.enable_progress_bar")
        ]
        run = subprocess.run(
            [sys.executable, "-m", "lightning_rl.cli", "fit", *args, *ddp],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]

    fit(2)
    runs = tmp_path / "exp_a"
    assert sorted(p.name for p in runs.iterdir()) == ["latest", "version_0"]  # rank 1 claimed nothing
    assert _step(runs / "latest" / "checkpoints" / "last.ckpt") == 2
    assert [p.name for p in (runs / "version_0").glob("*config.yaml")] == ["config.yaml"]
    fit(3, f"--ckpt_path={runs}/latest/checkpoints/last.ckpt")
    assert sorted(p.name for p in runs.iterdir()) == ["latest", "version_0"]
    assert _step(runs / "version_0" / "checkpoints" / "last.ckpt") == 3
    assert _tensorboard_runs(tmp_path) == ["exp_a/version_0"]
