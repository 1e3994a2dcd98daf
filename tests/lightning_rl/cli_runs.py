"""Run the CLI in-process on a tiny model with everything written under a temporary directory."""

from __future__ import annotations

from pathlib import Path

from lightning_rl.cli import main


def cli_args(
    root: Path, model_path: str, steps: int = 3, *extra: str, config: str | None = "configs/grpo.yaml"
) -> list[str]:
    args = [] if config is None else ["--config", str(Path(__file__).parents[2] / config)]
    return [
        *args,
        f"--model.policy.path={model_path}",
        "--data.batch_size=2",
        "--data.val_size=8",
        f"--trainer.max_steps={steps}",
        "--trainer.val_check_interval=2",
        f"--trainer.default_root_dir={root}",
        "--trainer.logger=lightning.pytorch.loggers.TensorBoardLogger",
        f"--trainer.logger.save_dir={root}",
        "--trainer.logger.name=run",
        "--trainer.callbacks=lightning.pytorch.callbacks.ModelCheckpoint",
        f"--trainer.callbacks.dirpath={root}/checkpoints",
        "--trainer.callbacks.save_last=true",
        "--trainer.callbacks.every_n_train_steps=2",
        "--trainer.callbacks.save_top_k=0",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        *extra,
    ]


def run_cli(subcommand: str, args: list[str]):
    return main([subcommand, *args])


def scalars(root: Path, name: str = "run") -> dict[str, list[tuple[int, float]]]:
    """TensorBoard scalars of the newest run under ``root/name``: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (version,) = sorted((root / name).glob("version_*"))[-1:]
    events = EventAccumulator(str(version))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def texts(root: Path) -> dict[str, list[tuple[int, str]]]:
    """TensorBoard text summaries of the newest run under ``root/run``: tag -> [(step, markdown)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (version,) = sorted((root / "run").glob("version_*"))[-1:]
    events = EventAccumulator(str(version), size_guidance={"tensors": 0})
    events.Reload()
    tags = [
        t for t in events.Tags()["tensors"] if t.endswith("/text_summary")
    ]  # not the Custom Scalars layout (a serialised proto)
    return {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors(tag)] for tag in tags}
