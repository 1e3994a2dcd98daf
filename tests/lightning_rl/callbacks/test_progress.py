"""The progress bar counts RL iterations against max_steps (right for DAPO's several prompt batches per
iteration and for a resumed run), times them from their wall clock, and shows the watched metrics with units."""

import re
import time
from types import SimpleNamespace

import pytest
import torch

from lightning_rl.callbacks.progress import LineProgress, RLProgressBar, missing_progress_bar
from lightning_rl.cli import DEFAULT_TRAINER_CONFIG, main
from tests.lightning_rl.cli_runs import cli_args, scalars

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
def test_bar_counts_and_times_iterations_for_dynamic_sampling_and_resume(tmp_path, tiny_model_path, monkeypatch):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # the terminal's bar
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
    from lightning_rl.callbacks.progress import IterationClock

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


def test_a_terminal_gets_the_bar_and_a_log_file_plain_lines(monkeypatch):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    assert [type(c) for c in missing_progress_bar([])] == [RLProgressBar]
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    assert [type(c) for c in missing_progress_bar([])] == [LineProgress]
    assert missing_progress_bar([], enabled=False) == [] and missing_progress_bar([LineProgress()]) == []


@pytest.mark.slow
def test_in_a_log_file_each_iteration_is_one_line_and_nothing_wraps(tmp_path, tiny_model_path, capsys, monkeypatch):
    """Rich draws its bar only on a terminal: in a log file the last frame was printed once, its metrics wrapped over
    seven lines. Now: a line per iteration (count, clock, metrics with units) and one per validation."""
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    args = cli_args(tmp_path, tiny_model_path, 3, "--trainer.enable_progress_bar=true", "--data.val_size=4")
    capsys.readouterr()
    main(["fit", *args])
    out = capsys.readouterr().out.splitlines()
    iterations = [line for line in out if line.startswith("RL iterations ")]
    assert [line.split(" • ")[0] for line in iterations] == [f"RL iterations {i}/3" for i in (1, 2, 3)]
    for line in iterations:  # one whole line each: count, clock, rate, then the watched metrics with their units
        assert re.fullmatch(
            r"RL iterations \d/3 • \d:\d\d:\d\d elapsed, \d:\d\d:\d\d left • [\d.]+ (it/s|s/it) • reward [\d.]+ • .*"
            r"length [\d.]+ tok • speed [\d.,]+ samples/s",
            line,
        ), line
    validations = [line for line in out if line.startswith("validation at iteration")]
    assert [v.split(" • ")[0] for v in validations] == [f"validation at iteration {i}" for i in (0, 2, 3)]
    assert all(re.fullmatch(r"validation at iteration \d • val reward [\d.]+", v) for v in validations)
    assert not [line for line in out if line.startswith(" ") and ("nats" in line or "samples/s" in line)]  # no wrap


def test_a_long_run_prints_about_a_hundred_lines():
    from types import SimpleNamespace

    bar = LineProgress(lines=100)
    printed = []
    bar._say = lambda head, metrics: printed.append(head)
    trainer = SimpleNamespace(max_steps=1000, global_step=0, callback_metrics={}, sanity_checking=False)
    module = SimpleNamespace()
    bar._trainer = trainer
    bar.on_train_start(trainer, module)
    for step in range(1, 1001):
        trainer.global_step = step
        bar.on_train_batch_start(trainer, module, None, step)
        bar.on_train_batch_end(trainer, module, None, None, step)
    assert len(printed) == 100 and printed[0].startswith("RL iterations 10/1000") and "1000/1000" in printed[-1]


def test_a_validate_commands_line_names_no_iteration():
    """`validate` restores a checkpoint's weights but not the loop's step (0 here): the line does not claim one."""
    from types import SimpleNamespace

    from lightning.pytorch.trainer.states import TrainerFn

    bar, printed = LineProgress(), []
    bar._say = lambda head, metrics: printed.append((head, metrics))
    for fn in (TrainerFn.VALIDATING, TrainerFn.FITTING):
        trainer = SimpleNamespace(
            global_step=0, sanity_checking=False, state=SimpleNamespace(fn=fn), callback_metrics={"val/reward": 0.5}
        )
        bar.on_validation_end(trainer, None)
    assert printed == [("validation", {"val reward": "0.500"}), ("validation at iteration 0", {"val reward": "0.500"})]
