"""Run folders: every `fit` writes into its own versioned folder, nothing of an earlier run is overwritten, and
``<save_dir>/<name>/latest/checkpoints`` reaches the newest run's checkpoints.

    runs/grpo/version_0/        TensorBoard events, config.yaml (written once, by the fit that started the run),
                                checkpoints/ (the checkpoint folder follows the logger's name and version)
    runs/grpo/version_1/        the next fit of the same preset
    runs/grpo/latest/           checkpoints -> ../version_1/checkpoints, config.yaml -> ../version_1/config.yaml

``latest`` is a folder of links, not a link to the version folder: TensorBoard follows links to folders, and a
``latest`` that reached the events would show every run twice under ``tensorboard --logdir runs``.

- A version folder is claimed with an exclusive ``mkdir`` (the next number on a clash), so two `fit` started
  together never share one (`start_run`, called by the CLI before the logger creates it).
- A checkpoint folder given as ``<save_dir>/<anything>/checkpoints`` (the presets' ``runs/grpo/checkpoints``, also
  when ``--trainer.logger.init_args.name`` renames the run) moves into the run's folder; any other ``dirpath`` is
  the user's and is kept as given.
- ``fit --ckpt_path`` of a checkpoint inside a run folder (``latest`` is resolved first) continues that run: same
  folder, steps continuing, a new event file beside the first. ``--new_run`` starts a new version instead.
- ``validate`` on such a checkpoint writes its points into that run, at the checkpoint's iteration.
- A ``fit --ckpt_path`` that names another ``model.policy.path`` than the checkpoint was trained from is refused
  before anything loads (`check_continued_policy`): the policy's path also gives the run its tokenizer and, without
  ``model.reference``, its KL reference, so the run would silently change both. ``--new_run`` starts a new run.
- A logger without versioned folders (W&B, MLflow) gets the same treatment for its checkpoint folder named
  ``checkpoints``: ``<parent>/version_N/checkpoints`` and ``<parent>/latest``. Without a logger (``--trainer.logger
  false``) the checkpoint folder is left as given and no run folder is made.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_rl.core.errors import ConfigError

LATEST = "latest"
LINKED = ("checkpoints", "config.yaml")  # what ``latest/`` links to in the newest run's folder (never its events)


def versioned(logger) -> bool:
    """A logger that writes into ``<save_dir>/<name>/version_N`` (and chooses N itself unless told)."""
    return isinstance(logger, (TensorBoardLogger, CSVLogger)) and bool(logger.save_dir) and bool(logger.name)


def resolve_checkpoint(ckpt_path: str | None) -> str | None:
    """A local checkpoint path with its links resolved (``runs/grpo/latest/checkpoints/last.ckpt`` ->
    ``runs/grpo/version_0/checkpoints/last.ckpt``), so a run started now cannot move it; other values as given."""
    if ckpt_path is None or "://" in str(ckpt_path) or not os.path.exists(ckpt_path):
        return ckpt_path
    return os.path.realpath(ckpt_path)


def recorded_policy_path(ckpt_path: str) -> str | None:
    """The ``model.policy.path`` a checkpoint was trained from (its ``hf_export`` entry), read without loading its
    weights (memory-mapped); None when it does not say (a DeepSpeed folder, a checkpoint of another module)."""
    from lightning_rl.checkpoint import SAFE_GLOBALS

    path = Path(ckpt_path)
    file = path if path.is_file() else path / "meta.pt"  # a file, or an FSDP2Strategy folder's metadata
    if not file.is_file():
        return None
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            checkpoint = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not one of ours: loading it says why
        return None
    return ((checkpoint.get("hf_export") or {}).get("policy") or {}).get("path")


def check_continued_policy(ckpt_path: str | None, policy_path: str) -> None:
    """Refuse (`ConfigError`) to continue the run of ``ckpt_path`` with ``policy_path`` when the checkpoint was trained
    from another ``model.policy.path`` (the same folder written two ways is the same)."""
    recorded = recorded_policy_path(ckpt_path) if ckpt_path is not None and "://" not in str(ckpt_path) else None
    if recorded is None or _same_model_path(recorded, policy_path):
        return
    raise ConfigError(
        f"--ckpt_path {shown_path(Path(ckpt_path))} was trained from model.policy.path {recorded!r}, and this run gives "
        f"{policy_path!r}: the policy's path also gives the run its tokenizer and (without model.reference) its KL "
        f"reference. Give --model.policy.path {recorded}, or --new_run to start a new run from these weights"
    )


def _same_model_path(a: str, b: str) -> bool:
    a, b = os.path.expanduser(a), os.path.expanduser(b)
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.normpath(a) == os.path.normpath(b)


def run_of_checkpoint(ckpt_path: str | None) -> Path | None:
    """``<root>/version_N`` for a checkpoint at ``<root>/version_N/checkpoints/<file or folder>``, else None."""
    if ckpt_path is None or "://" in str(ckpt_path):
        return None
    checkpoint = Path(os.path.realpath(ckpt_path))
    return (
        checkpoint.parent.parent
        if checkpoint.parent.name == "checkpoints" and is_version(checkpoint.parent.parent)
        else None
    )


def claim_version(root: Path) -> Path:
    """Create ``root/version_N`` for the next free N, atomically: ``mkdir`` fails on a folder another process made
    first, and then the next number is tried."""
    root.mkdir(parents=True, exist_ok=True)
    version = _next_version(root)
    while True:
        run = root / f"version_{version}"
        try:
            run.mkdir()
            return run
        except FileExistsError:
            version += 1


def _next_version(root: Path) -> int:
    """One past the highest ``version_N`` under ``root`` (0 for none), as TensorBoard's logger numbers its folders."""
    versions = [int(p.name.removeprefix("version_")) for p in root.glob("version_*") if is_version(p)]
    return max(versions, default=-1) + 1


def follows_run(dirpath: str | None, logger) -> bool:
    """Whether a ModelCheckpoint's folder is the run layout that moves into the run's folder (see the module's doc)."""
    if dirpath is None:
        return True
    folder = Path(os.path.abspath(dirpath))
    return folder.name == "checkpoints" and folder.parent.parent == Path(os.path.abspath(logger.save_dir))


def continued_run(logger, ckpt_path: str | None, stage: str, new_run: bool = False) -> Path | None:
    """The run folder a command continues (fit) or logs into (validate): the checkpoint's own run, for a TensorBoard
    logger of the same ``save_dir`` (a CSVLogger empties a folder's metrics.csv when it starts); None: a new version."""
    run = run_of_checkpoint(ckpt_path)
    if run is None or (stage == "fit" and new_run) or not (isinstance(logger, TensorBoardLogger) and versioned(logger)):
        return None
    return run if run.parent.parent == Path(os.path.realpath(logger.save_dir)) else None


def start_run(trainer, stage: str, ckpt_path: str | None, new_run: bool = False) -> None:
    """Choose the run folder of a ``fit`` / ``validate`` before anything is written (the CLI calls it on every rank; only
    global rank 0 claims a folder, and Lightning broadcasts rank 0's folders at setup). A checkpoint inside a run
    folder of the same ``save_dir`` continues that run (validate: logs into it), unless ``new_run``."""
    for logger in trainer.loggers:
        if not versioned(logger) or getattr(logger, "_experiment", None) is not None or logger._version is not None:
            continue  # experiment already created or version pinned by the user: theirs
        run = continued_run(logger, ckpt_path, stage, new_run)
        if run is not None:
            logger._name, logger._version = run.parent.name, int(run.name.removeprefix("version_"))
            if stage == "fit":
                rank_zero_info(
                    f"Continuing the run in {shown_path(run)} from {shown_path(Path(ckpt_path))} (--new_run starts a new version)"
                )
        elif trainer.global_rank == 0:
            logger._version = int(claim_version(Path(logger.save_dir) / logger.name).name.removeprefix("version_"))
    if trainer.loggers and not versioned(trainer.loggers[0]) and stage == "fit":
        resumed = None if new_run else run_of_checkpoint(ckpt_path)
        for checkpoint in checkpoint_callbacks(trainer):
            folder = Path(checkpoint.dirpath) if checkpoint.dirpath is not None else None
            if folder is None or folder.name != "checkpoints" or is_version(folder.parent):
                continue
            if resumed is not None and resumed.parent == Path(os.path.realpath(folder.parent)):
                checkpoint.dirpath = str(folder.parent / resumed.name / "checkpoints")
            elif trainer.global_rank == 0:
                checkpoint.dirpath = str(claim_version(folder.parent) / "checkpoints")


def run_folder(trainer) -> Path | None:
    """The folder of this command's run as global rank 0 sees it (no collective): the logger's version folder, or
    for a logger without one the versioned checkpoint folder's parent; None without a logger."""
    logger = trainer.logger
    if logger is None:
        return None
    if versioned(logger):
        return Path(logger.log_dir)
    for checkpoint in checkpoint_callbacks(trainer):
        if checkpoint.dirpath is not None and is_version(Path(checkpoint.dirpath).parent):
            return Path(checkpoint.dirpath).parent
    return None


def claim_file(folder: Path, names: list[str]) -> Path:
    """The first of ``names`` not taken in ``folder``, created empty with an exclusive open (then ``name.2``, ...)."""
    candidates = [*names, *(f"{Path(names[-1]).stem}.{k}{Path(names[-1]).suffix}" for k in range(2, 10_000))]
    for name in candidates:
        try:
            with open(folder / name, "x"):
                return folder / name
        except FileExistsError:
            continue
    raise FileExistsError(f"{folder}: no free name for {names[-1]}")


def link_latest(run: Path) -> None:
    """Point ``<root>/latest/checkpoints`` and ``config.yaml`` at ``run``'s, each replaced atomically (a reader sees the
    old run's or the new run's, never none). An older layout's ``latest`` link to a version folder is replaced. A run
    without a ``config.yaml`` (composed in Python: lightning_rl.trainer) leaves none in ``latest`` (not the previous run's)."""
    latest = run.parent / LATEST
    if latest.is_symlink() or latest.is_file():
        latest.unlink()
    latest.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        if (
            name == "config.yaml" and not (run / name).exists()
        ):  # the checkpoints folder is linked before its first save
            (latest / name).unlink(missing_ok=True)
            continue
        tmp = latest / f".{name}.tmp-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(Path("..") / run.name / name)  # relative: the runs folder can move
        os.replace(tmp, latest / name)


def checkpoint_callbacks(trainer) -> list[ModelCheckpoint]:
    return [c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)]


def is_version(folder: Path) -> bool:
    return folder.name.startswith("version_") and folder.name.removeprefix("version_").isdigit()


def shown_path(path: Path) -> str:
    """``path`` relative to the working folder when it is under it, as a config would write it."""
    path = Path(os.path.abspath(path))
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def tensorboard(trainer):
    """The run's TensorBoard writer (a `SummaryWriter`: custom scalar layouts, histograms, text, images), on global rank
    0 and when the run's logger writes TensorBoard events; None otherwise (another logger draws none of these)."""
    from torch.utils.tensorboard import SummaryWriter

    if trainer.global_rank != 0 or trainer.logger is None:
        return None
    experiment = trainer.logger.experiment
    return experiment if isinstance(experiment, SummaryWriter) else None
