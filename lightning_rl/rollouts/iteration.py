"""One RL iteration of a rollout record: the batch as it was trained and what training it again needs, in one Parquet
file (``iteration_000042.parquet``; rank r > 0 of a data-parallel run: ``iteration_000042.rank1.parquet``).

The file's rows are the batch's samples (lightning_rl.rollouts.columns), plus ``staleness`` (the trained weights'
version minus the sample's) for people reading it with pandas or DuckDB. Its metadata holds the rest, as JSON
(``lightning_rl``) and as tensors (``lightning_rl.tensors``, safetensors bytes in base64):

    format_version   FORMAT_VERSION: a reader refuses a newer one
    iteration, rank, world_size, version (the policy version the batch trained), collected (the fields the rollout and
                     the reward gave; the others the trainer computed from them)
    random/*         torch's random state (and CUDA's) and the mini-batch shuffle's when the trainer's side of the
                     iteration began: dropout and the mini-batch order draw from them
    modes            the training flag of each submodule of the trained models then (whether dropout is on)
    metrics/*        the collect phase's metrics (weighted sums, weights, maxima, minima), logged again by a replay
    inputs/*         the iteration's other inputs (PPO-ptx's pretraining text)
    weights          `weights_checksum` of the trained parameters before the update
"""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.rollouts.columns import KEY, batch_columns, read_batch, read_tensor

FORMAT_VERSION = 1
"""The version of the files this code writes; bumped when a reader of the previous one would misread a new file."""
TENSORS_KEY = b"lightning_rl.tensors"
FILE = re.compile(r"iteration_(\d+)(?:\.rank(\d+))?\.parquet")


@dataclass
class RecordedIteration:
    """One iteration of a record: ``batch`` as it was trained, and what a replay restores to train it again."""

    iteration: int
    """The RL iteration (1 = the first; ``trainer.global_step`` after it)."""
    batch: RolloutBatch
    """As trained: the rollout's and the reward's fields (``collected``) and those the trainer computed from them."""
    collected: tuple[str, ...]
    """The fields of ``batch`` the collect phase gave (sampler, environment, reward); a replay starts from these."""
    version: int
    """The policy version that trained the batch (the weight pushes before it); ``batch.versions`` sampled it."""
    rank: int = 0
    world_size: int = 1
    random: dict[str, Tensor] = field(default_factory=dict)
    """``torch`` (and ``cuda``) random state and the mini-batch ``shuffle`` generator's, as the trainer's side began."""
    metrics: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    """The collect phase's metrics: ``sums``, ``weights``, ``maxima``, ``minima`` (lightning_rl.loop.metrics)."""
    inputs: dict[str, Tensor] = field(default_factory=dict)
    """The iteration's other inputs by name (``ptx_ids``, ``ptx_mask``: PPO-ptx's text)."""
    weights: Tensor | None = None
    """`weights_checksum` of the trained parameters before this iteration's update."""
    modes: Tensor | None = None
    """(M,) bool: the training flag of each submodule of the trained models as the trainer's side began (dropout)."""

    @property
    def staleness(self) -> Tensor | None:
        """(B,) long: how many versions older than the trained weights each sample's are (None: no versions)."""
        return None if self.batch.versions is None else self.version - self.batch.versions.cpu()

    def rollout(self) -> RolloutBatch:
        """The batch as the collect phase gave it: the fields the trainer computes (log-probs, values, advantages)
        left out."""
        computed = [f.name for f in fields(self.batch) if f.name not in self.collected]
        return self.batch.replace(**dict.fromkeys(computed))


def file_name(iteration: int, rank: int = 0) -> str:
    return f"iteration_{iteration:06d}.parquet" if rank == 0 else f"iteration_{iteration:06d}.rank{rank}.parquet"


def parse_name(name: str) -> tuple[int, int] | None:
    """(iteration, rank) of a record file's name; None for any other file."""
    match = FILE.fullmatch(name)
    return None if match is None else (int(match.group(1)), int(match.group(2) or 0))


def weights_checksum(model: nn.Module) -> Tensor:
    """(N,) int64: per trained parameter, the sum of its elements' bits read as integers, modulo 2^32 (2^64 for 8-byte
    elements). Integer addition that wraps is exact and independent of the order of the sum, so equal weights give
    equal checksums on any device or thread count, and one changed bit changes it; one pass over the weights, with no
    copy (the cheapest exact check there is). A sharded parameter contributes its local shard."""
    sums = []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        local = (p.to_local() if isinstance(p, DTensor) else p).detach()
        bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[local.element_size()]
        wraps = torch.int64 if local.element_size() == 8 else torch.int32
        sums.append(local.view(bits).sum(dtype=wraps).to(torch.int64))
    return torch.stack(sums).cpu() if sums else torch.zeros(0, dtype=torch.int64)


def write_iteration(record: RecordedIteration, folder: Path, library_version: str) -> Path:
    """``record`` as ``folder/<file_name>``, written atomically (a reader sees the whole file or none)."""
    columns, arrays = batch_columns(record.batch, folder)
    if record.batch.versions is not None:
        staleness = pa.array(record.staleness.numpy())
        columns.append(pa.field("staleness", staleness.type))
        arrays.append(staleness)
    meta = {
        "format_version": FORMAT_VERSION,
        "library_version": library_version,
        "iteration": record.iteration,
        "rank": record.rank,
        "world_size": record.world_size,
        "version": record.version,
        "collected": list(record.collected),
    }
    tensors = {f"random/{k}": v for k, v in record.random.items()}
    tensors |= {f"metrics/{kind}/{k}": v for kind, named in record.metrics.items() for k, v in named.items()}
    tensors |= {f"inputs/{k}": v for k, v in record.inputs.items()}
    tensors |= {
        name: value for name, value in (("weights", record.weights), ("modes", record.modes)) if value is not None
    }
    # clones: safetensors refuses two names on one storage (a metric logged under two names)
    blob = save_tensors({k: v.detach().cpu().clone().contiguous() for k, v in tensors.items()})
    table = pa.Table.from_arrays(arrays, schema=pa.schema(columns))
    path = folder / file_name(record.iteration, record.rank)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with pq.ParquetWriter(tmp, table.schema, compression="zstd") as writer:
        writer.write_table(table)
        # in the file's metadata only: in the Arrow schema's too, Parquet would store it twice
        writer.add_key_value_metadata({KEY: json.dumps(meta), TENSORS_KEY: base64.b64encode(blob)})
    os.replace(tmp, path)
    return path


def read_meta(path: Path) -> dict:
    """The file's JSON metadata (without reading its rows); refuses a file of a newer format."""
    metadata = pq.read_metadata(path).metadata or {}
    if KEY not in metadata:
        raise ValueError(f"{path} is not an iteration of a rollout record (no {KEY.decode()} metadata)")
    meta = json.loads(metadata[KEY])
    if meta["format_version"] > FORMAT_VERSION:
        raise ValueError(
            f"{path} was written in rollout record format {meta['format_version']} (lightning_rl "
            f"{meta.get('library_version')}); this lightning_rl reads format {FORMAT_VERSION} and older: upgrade it"
        )
    return meta


def read_fields(path: Path, names) -> dict[str, Tensor]:
    """The tensor fields ``names`` of a file that it holds, without reading its other columns."""
    present = [name for name in names if name in pq.read_schema(path).names]
    table = pq.read_table(path, columns=present)
    return {
        name: read_tensor(table.column(name).combine_chunks(), json.loads(table.schema.field(name).metadata[KEY]))
        for name in present
    }


def read_iteration(path: Path) -> RecordedIteration:
    """The `RecordedIteration` of one file (images and per-row tensors read from beside it), on the CPU."""
    path = Path(path)
    meta = read_meta(path)
    table = pq.read_table(path)
    tensors = load_tensors(base64.b64decode(pq.read_metadata(path).metadata[TENSORS_KEY]))
    metrics: dict[str, dict[str, Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("metrics/"):
            kind, name = key.removeprefix("metrics/").split("/", 1)
            metrics.setdefault(kind, {})[name] = value
    return RecordedIteration(
        iteration=meta["iteration"],
        batch=read_batch(table, path.parent),
        collected=tuple(meta["collected"]),
        version=meta["version"],
        rank=meta["rank"],
        world_size=meta["world_size"],
        random={k.removeprefix("random/"): v for k, v in tensors.items() if k.startswith("random/")},
        metrics=metrics,
        inputs={k.removeprefix("inputs/"): v for k, v in tensors.items() if k.startswith("inputs/")},
        weights=tensors.get("weights"),
        modes=tensors.get("modes"),
    )
