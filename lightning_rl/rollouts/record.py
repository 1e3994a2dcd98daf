"""A rollout record: the folder a run records its trained batches into (``runs/<name>/version_N/rollouts/``).

    rollouts/
      manifest.json               format and library versions, the world size, each fit that recorded into it
      config.yaml                 the run's config, as the fit that started the run wrote it
      iteration_000001.parquet    one file per RL iteration (and per rank r > 0: iteration_000001.rank1.parquet)
      images/<sha256>.png         the prompts' images, by content
      tensors/<sha256>.safetensors  other per-row tensors (a vision-language prompt's processed images), by content

`Record` reads one; `load` returns its batches. Files are written by lightning_rl.rollouts.writer.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import time
from pathlib import Path
from typing import Iterator

import torch

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.rollouts.iteration import FORMAT_VERSION, RecordedIteration, parse_name, read_iteration

MANIFEST, CONFIG = "manifest.json", "config.yaml"


def library_version() -> str:
    try:
        return importlib.metadata.version("lightning-rl")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class Record:
    """The record in a folder (or the folder of one of its files): its iterations, manifest and config."""

    def __init__(self, path: str | Path):
        path = Path(path)
        self.folder = path.parent if path.is_file() else path
        if not self.folder.is_dir():
            raise FileNotFoundError(
                f"no rollout record at {path}: a run records one with record_rollouts: true (lightning-rl fit "
                "--record_rollouts true), in runs/<name>/version_N/rollouts"
            )
        self.files = {key: p for p in self.folder.iterdir() if (key := parse_name(p.name)) is not None}
        if not self.files:
            raise FileNotFoundError(f"{path} holds no recorded iteration (iteration_*.parquet)")
        self.manifest = json.loads((self.folder / MANIFEST).read_text()) if (self.folder / MANIFEST).is_file() else {}

    @property
    def iterations(self) -> list[int]:
        """The iterations recorded, in order (rank 0's files)."""
        return sorted(iteration for iteration, rank in self.files if rank == 0)

    @property
    def world_size(self) -> int:
        return 1 + max(rank for _, rank in self.files)

    @property
    def config(self) -> Path | None:
        """The run's config beside the record (None when the run was composed in Python)."""
        path = self.folder / CONFIG
        return path if path.is_file() else None

    def path(self, iteration: int, rank: int = 0) -> Path:
        if (iteration, rank) not in self.files:
            held = self.iterations
            raise FileNotFoundError(
                f"{self.folder} holds no iteration {iteration}"
                + (f" of rank {rank}" if rank else "")
                + f" (it holds {held[0]}..{held[-1]}, {len(held)} iterations"
                + (", the oldest removed by keep_last" if held[0] > 1 else "")
                + ")"
            )
        return self.files[(iteration, rank)]

    def read(self, iteration: int, rank: int = 0) -> RecordedIteration:
        return read_iteration(self.path(iteration, rank))

    def __iter__(self) -> Iterator[RecordedIteration]:
        """Rank 0's iterations in order, read one at a time."""
        return (self.read(i) for i in self.iterations)

    def __len__(self) -> int:
        return len(self.iterations)


def load(path: str | Path, rank: int = 0) -> list[RolloutBatch]:
    """The batches of a record, as they were trained, in iteration order: every iteration of ``rank`` in a record's
    folder, or the one in a file. `Record` gives each with its iteration, version and the rest."""
    path = Path(path)
    if path.is_file():
        return [read_iteration(path).batch]
    record = Record(path)
    return [record.read(i, rank).batch for i in record.iterations]


def start_session(folder: Path, iteration: int, world_size: int, config: Path | None) -> None:
    """Before a fit records into ``folder`` (rank 0): the manifest written, or a session added to it; the config
    copied beside the files once; the files of iterations after ``iteration`` (the checkpoint a resumed fit starts
    from) removed, since the resumed fit trains them again."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        key = parse_name(path.name)
        if key is not None and key[0] > iteration:
            path.unlink()
    manifest_path = folder / MANIFEST
    manifest = (
        json.loads(manifest_path.read_text())
        if manifest_path.is_file()
        else {
            "format": "lightning_rl rollout record",
            "format_version": FORMAT_VERSION,
            "world_size": world_size,
            "config": None,
            "sessions": [],
        }
    )
    if config is not None and not (folder / CONFIG).exists():
        (folder / CONFIG).write_text(config.read_text())
        manifest["config"] = CONFIG
    manifest["sessions"].append(
        {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "from_iteration": iteration + 1,
            "world_size": world_size,
            "library_version": library_version(),
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
        }
    )
    tmp = manifest_path.with_name(f".{MANIFEST}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, manifest_path)


def prune(folder: Path, keep_last: int) -> None:
    """Remove the files of all but the newest ``keep_last`` iterations (every rank's). Images and tensors by content
    stay: later iterations may name them."""
    files = [(key, p) for p in folder.iterdir() if (key := parse_name(p.name)) is not None]
    newest = sorted({iteration for (iteration, _), _ in files})[-keep_last:]
    for (iteration, _), path in files:
        if newest and iteration < newest[0]:
            path.unlink(missing_ok=True)
