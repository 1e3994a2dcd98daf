"""The progress bar counts RL iterations against max_steps (right for DAPO's several prompt batches per
iteration and for a resumed run), times them from their wall clock, and shows the watched metrics with units."""

import re
import time
from types import SimpleNamespace

import pytest
import torch

from lightning_rl.cli import DEFAULT_TRAINER_CONFIG, main
from lightning_rl.cli.progress import RLProgressBar

from .cli_runs import cli_args, scalars

PHASES = (
    "rollout",
    "score",
    "estimate",
    "optimize",
    "sync",
)  # an iteration's phases (time/rollout_wait_s is inside rollout)


def _fit(tmp_path, model_path, steps, ckpt_path=None):
    args = cli_args(
        tmp_path,
        model_path,
        steps,
        "--trainer.enable_progress_bar=true",
        "--data.val_data=null",
        config="configs/dapo.yaml",
    )
    cli = main(["--config", DEFAULT_TRAINER_CONFIG, *args], run=False)
    start = time.monotonic()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt_path)
    wall = time.monotonic() - start
    bar = cli.trainer.progress_bar_callback
    task = bar.progress.tasks[bar.train_progress_bar_id]
    return bar, task, cli.trainer, wall


def _shown(bar, task) -> tuple[int, int, int, float]:
    """(done, total, elapsed seconds, iterations per second) as the bar's row for the training task reads."""
    from rich.text import Text

    row = " ".join(r.plain for r in (column.render(task) for column in bar.progress.columns) if isinstance(r, Text))
    done, total, h, m, s, rate, unit = re.search(
        r"(\d+)/(\d+)\s+(\d+):(\d\d):(\d\d) • \S+\s+([\d.]+) ?(it/s|s/it)", row
    ).groups()
    return (
        int(done),
        int(total),
        int(h) * 3600 + int(m) * 60 + int(s),
        float(rate) if unit == "it/s" else 1 / float(rate),
    )


def _phase_seconds(root, first_step: int) -> float:
    """Seconds the iterations logged from ``first_step`` on spent in their phases (TensorBoard's time/*_s)."""
    logged = scalars(root)
    return sum(v for phase in PHASES for step, v in logged.get(f"time/{phase}_s", []) if step >= first_step)


@pytest.mark.slow
def test_bar_counts_and_times_iterations_for_dynamic_sampling_and_resume(tmp_path, tiny_model_path):
    bar, task, trainer, wall = _fit(tmp_path, tiny_model_path, 2)
    assert isinstance(bar, RLProgressBar) and task.description.endswith("RL iterations")
    done, total, elapsed, rate = _shown(bar, task)
    assert (done, total) == (2, 2)  # not the prompt batches dynamic sampling read
    # the rate is the iterations' own: at most 2 per the seconds their phases took, at least 2 per the whole fit
    assert 2 / wall * 0.95 <= rate <= 2 / _phase_seconds(tmp_path, 0) * 1.05 + 0.01
    assert elapsed <= wall
    shown = bar.get_metrics(trainer, trainer.lightning_module)
    assert (
        shown["reward"].count(".") == 1 and shown["length"].endswith(" tok") and shown["speed"].endswith(" samples/s")
    )
    bar, task, _, wall = _fit(tmp_path, tiny_model_path, 4, tmp_path / "checkpoints" / "last.ckpt")
    done, total, elapsed, rate = _shown(bar, task)
    assert (done, total) == (4, 4)  # resumed at 2: never 4/3
    assert 2 / wall * 0.95 <= rate <= 2 / _phase_seconds(tmp_path, 2) * 1.05 + 0.01  # the 2 iterations this process ran
    assert elapsed <= wall


def test_the_clock_times_iterations_not_the_count_jumps():
    from lightning_rl.cli.progress import IterationClock

    now = [100.0]
    clock = IterationClock(now=lambda: now[0])
    clock.start()
    now[0] += 4.0  # validation before the first iteration: on the wall clock, not in an iteration
    for seconds in (2.0, 3.0):
        clock.begin_iteration()
        now[0] += seconds
        clock.end_iteration()
    assert clock.elapsed == 9.0 and clock.seconds_per_iteration == 2.5
    assert clock.remaining(10) == 25.0 and clock.rate() == "2.50 s/it"
    clock.start()  # a resumed run: its own iterations only
    for _ in range(4):
        clock.begin_iteration()
        now[0] += 0.25
        clock.end_iteration()
    assert clock.elapsed == 1.0 and clock.rate() == "4.00 it/s"


def test_the_held_out_score_is_named_by_its_metric_not_as_an_accuracy():
    bar = RLProgressBar()
    trainer = SimpleNamespace(callback_metrics={"val/reward": torch.tensor(0.25), "reward/mean": torch.tensor(0.5)})
    assert bar.get_metrics(trainer, None) == {"reward": "0.500", "val reward": "0.250"}


@pytest.mark.slow
def test_zero_var_groups_is_logged_only_where_groups_exist(tmp_path, tiny_model_path):
    for config, logged, samples in (
        ("configs/reinforce.yaml", False, 2 * 1),
        ("configs/grpo.yaml", True, 2 * 8),
    ):  # 2 prompts x G
        args = cli_args(tmp_path / config.split("/")[1], tiny_model_path, 1, "--data.val_data=null", config=config)
        cli = main(["--config", DEFAULT_TRAINER_CONFIG, *args], run=False)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        metrics = cli.trainer.callback_metrics
        assert ("sampling/zero_var_groups" in metrics) is logged, config
        seconds = sum(float(metrics[f"time/{phase}_s"]) for phase in PHASES if f"time/{phase}_s" in metrics)
        assert float(metrics["throughput/samples_per_s"]) * seconds == pytest.approx(samples, rel=1e-4), config
