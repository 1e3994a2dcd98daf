"""The progress bar counts RL iterations against max_steps (right for DAPO's several prompt batches per
iteration and for a resumed run) and shows the watched metrics with units."""

import pytest

from lightning_rl.cli import DEFAULT_TRAINER_CONFIG, main
from lightning_rl.cli.progress import RLProgressBar

from .cli_runs import cli_args


def _fit(tmp_path, model_path, steps, ckpt_path=None):
    args = cli_args(tmp_path, model_path, steps, "--trainer.enable_progress_bar=true", "--data.val_data=null", config="configs/dapo.yaml")
    cli = main(["--config", DEFAULT_TRAINER_CONFIG, *args], run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt_path)
    bar = cli.trainer.progress_bar_callback
    task = bar.progress.tasks[bar.train_progress_bar_id]
    return bar, task, cli.trainer


@pytest.mark.slow
def test_bar_counts_iterations_for_dynamic_sampling_and_resume(tmp_path, tiny_model_path):
    bar, task, trainer = _fit(tmp_path, tiny_model_path, 2)
    assert isinstance(bar, RLProgressBar) and task.description.endswith("RL iterations")
    assert (task.completed, task.total) == (2, 2)  # not the prompt batches dynamic sampling read
    shown = bar.get_metrics(trainer, trainer.lightning_module)
    assert shown["reward"].count(".") == 1 and shown["length"].endswith(" tok") and shown["speed"].endswith(" samples/s")
    bar, task, _ = _fit(tmp_path, tiny_model_path, 4, tmp_path / "checkpoints" / "last.ckpt")
    assert (task.completed, task.total) == (4, 4)  # resumed at 2: never 4/3


@pytest.mark.slow
def test_zero_var_groups_is_logged_only_where_groups_exist(tmp_path, tiny_model_path):
    for config, logged, samples in (("configs/reinforce.yaml", False, 2 * 1), ("configs/grpo.yaml", True, 2 * 8)):  # 2 prompts x G
        args = cli_args(tmp_path / config.split("/")[1], tiny_model_path, 1, "--data.val_data=null", config=config)
        cli = main(["--config", DEFAULT_TRAINER_CONFIG, *args], run=False)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        metrics = cli.trainer.callback_metrics
        assert ("sampling/zero_var_groups" in metrics) is logged, config
        phases = ("rollout", "score", "estimate", "optimize", "sync")  # the iteration's phases (time/rollout_wait_s is inside rollout)
        seconds = sum(float(metrics[f"time/{phase}_s"]) for phase in phases if f"time/{phase}_s" in metrics)
        assert float(metrics["throughput/samples_per_s"]) * seconds == pytest.approx(samples, rel=1e-4), config
