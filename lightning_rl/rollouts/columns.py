"""A `RolloutBatch` as Arrow columns and back, exactly: one row per sample, every field of the batch a column.

    tensor fields        (B,) a column of numbers; (B, R, ...) a fixed-size list of R x ... numbers per row, row-major.
                         Any tensor field, including ones added later (a per-token routes tensor of (B, R, layers,
                         top_k)), is written the same way: its dtype and trailing shape go in the column's metadata.
                         bfloat16 travels as its 16 raw bits (Arrow has no bfloat16), every other dtype as itself.
    score_parts.<name>   (B,) a reward's named parts
    columns.<name>       per-row values: text and numbers as themselves, anything else (None, lists, dicts, an
                         agent's result) as JSON text
    images               per row, the prompt's images by content hash: PNG files in ``images/`` beside the record
    image_inputs, ...    any other per-row list field: tensors (or a dict of them) by content hash, safetensors files
                         in ``tensors/`` (a prompt's entry, shared by its group, is written once); other values as JSON

The bytes of every tensor are kept (no rounding, no trimmed padding), so a batch read back equals the batch written,
bit for bit. Each column's metadata (``lightning_rl``) says which field it is and how it is encoded.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch

KEY = b"lightning_rl"
"""The metadata key of each column (and of the file: lightning_rl.rollouts.iteration)."""
IMAGES, TENSORS = "images", "tensors"
"""The folders beside a record's files that hold images and per-row tensors by content hash."""
RAW_BITS = {torch.bfloat16: torch.int16}
"""dtypes Arrow cannot hold, written as the integers of their bits."""


def batch_columns(batch: RolloutBatch, blobs: Path) -> tuple[list[pa.Field], list[pa.Array]]:
    """The Arrow fields and arrays of ``batch`` (its tensors on any device); images and per-row tensors are written
    under ``blobs`` (once per content)."""
    out: list[tuple[pa.Field, pa.Array]] = []
    for f in fields(batch):
        value = getattr(batch, f.name)
        if value is None:
            continue
        if isinstance(value, Tensor):
            out.append(tensor_column(f.name, value, {"field": f.name}))
        elif f.name == "score_parts":
            out += [tensor_column(f"score_parts.{k}", v, {"field": f.name, "name": k}) for k, v in value.items()]
        elif f.name == "columns":
            out += [_values_column(f"columns.{k}", v, {"field": f.name, "name": k}) for k, v in value.items()]
        elif isinstance(value, list):
            out.append(_list_column(f.name, value, blobs))
        else:
            raise TypeError(
                f"RolloutBatch.{f.name} holds a {type(value).__name__}, which a rollout record cannot write"
            )
    return [field for field, _ in out], [array for _, array in out]


def read_batch(table: pa.Table, blobs: Path, batch_type: type[RolloutBatch] = RolloutBatch) -> RolloutBatch:
    """The ``batch_type`` of ``table`` (its columns as `batch_columns` wrote them), on the CPU."""
    values: dict[str, Any] = {}
    loaded: dict[str, Any] = {}  # a blob read once, shared by the rows that name it
    for index, field in enumerate(table.schema):
        meta = json.loads(field.metadata[KEY]) if field.metadata and KEY in field.metadata else None
        if meta is None:
            continue  # a column for people (staleness), not a field
        column = table.column(index).combine_chunks()
        kind, name = meta["kind"], meta["field"]
        if kind == "tensor" and name == "score_parts":
            values.setdefault(name, {})[meta["name"]] = read_tensor(column, meta)
        elif kind == "tensor":
            values[name] = read_tensor(column, meta)
        elif name == "columns":
            values.setdefault(name, {})[meta["name"]] = _read_values(column, meta)
        else:
            values[name] = _read_list(column, meta, blobs, loaded)
    return batch_type(**values)


# ---------------------------------------------------------------------------------------------- tensors


def tensor_column(name: str, tensor: Tensor, meta: dict) -> tuple[pa.Field, pa.Array]:
    """A (B, ...) tensor as a column of B rows: numbers, or a fixed-size list of the trailing dims' numbers."""
    tensor = tensor.detach().cpu().contiguous()
    stored = tensor.view(RAW_BITS[tensor.dtype]) if tensor.dtype in RAW_BITS else tensor
    shape = list(tensor.shape[1:])
    values = pa.array(stored.numpy().reshape(-1))
    if not shape:
        array = values
    elif math.prod(shape):
        array = pa.FixedSizeListArray.from_arrays(values, math.prod(shape))
    else:  # rows of no values (a response of width 0): Arrow's fixed-size lists are at least one long
        array = pa.ListArray.from_arrays(pa.array(np.zeros(len(tensor) + 1, dtype=np.int32)), values)
    meta = {**meta, "kind": "tensor", "dtype": str(tensor.dtype).removeprefix("torch."), "shape": shape}
    return pa.field(name, array.type, nullable=False, metadata={KEY: json.dumps(meta)}), array


def read_tensor(column: pa.Array, meta: dict) -> Tensor:
    dtype = getattr(torch, meta["dtype"])
    flat = column.flatten() if meta["shape"] else column
    array = flat.to_numpy(zero_copy_only=False)
    tensor = torch.from_numpy(np.array(array, copy=True)).reshape(len(column), *meta["shape"])
    return tensor.view(dtype) if dtype in RAW_BITS else tensor.to(dtype)


# ---------------------------------------------------------------------------------------------- per-row values


def _values_column(name: str, values: list, meta: dict) -> tuple[pa.Field, pa.Array]:
    """Text and numbers as themselves; anything else as JSON (a value JSON cannot write, as its text)."""
    kinds = {type(v) for v in values}
    native = {str: pa.string(), bool: pa.bool_(), int: pa.int64(), float: pa.float64()}
    if len(kinds) == 1 and next(iter(kinds)) in native:
        kind, array = "value", pa.array(values, type=native[next(iter(kinds))])
    else:
        kind, array = "json", pa.array([json.dumps(v, default=str) for v in values], type=pa.string())
    return pa.field(name, array.type, metadata={KEY: json.dumps({**meta, "kind": kind})}), array


def _read_values(column: pa.Array, meta: dict) -> list:
    values = column.to_pylist()
    return [json.loads(v) for v in values] if meta["kind"] == "json" else values


def _list_column(name: str, entries: list, blobs: Path) -> tuple[pa.Field, pa.Array]:
    """A per-row list field (``images``, ``image_inputs``, ...): images and tensors by content hash, once per entry
    object (a prompt's rows share theirs), else JSON."""
    written: dict[int, Any] = {}

    def key(entry):
        if id(entry) not in written:
            written[id(entry)] = _write_entry(entry, blobs)
        return written[id(entry)]

    keys = [key(e) for e in entries]
    kind = next((k["kind"] for k in keys if k is not None), "json")
    stored = [None if k is None else k["value"] for k in keys]
    array = pa.array([json.dumps(v) for v in stored], type=pa.string())
    return pa.field(name, array.type, metadata={KEY: json.dumps({"field": name, "kind": kind})}), array


def _write_entry(entry: Any, blobs: Path) -> dict | None:
    from PIL import Image

    if entry is None:
        return None
    if isinstance(entry, Image.Image) or (
        isinstance(entry, list) and entry and all(isinstance(i, Image.Image) for i in entry)
    ):
        images = [entry] if isinstance(entry, Image.Image) else entry
        return {
            "kind": "images" if isinstance(entry, list) else "image",
            "value": [_write_image(i, blobs) for i in images],
        }
    if isinstance(entry, Tensor) or (
        isinstance(entry, dict) and entry and all(isinstance(v, Tensor) for v in entry.values())
    ):
        tensors = {"": entry} if isinstance(entry, Tensor) else entry
        data = save_tensors({k: v.detach().cpu().clone().contiguous() for k, v in tensors.items()})
        digest = hashlib.sha256(data).hexdigest()
        _write_once(blobs / TENSORS / f"{digest}.safetensors", data)
        return {"kind": "tensor" if isinstance(entry, Tensor) else "tensors", "value": digest}
    return {"kind": "json", "value": entry}


def _write_image(image, blobs: Path) -> str:
    """The image's hash (its mode, size and pixels); its PNG written the first time the hash is seen."""
    digest = hashlib.sha256(f"{image.mode}|{image.size}|".encode() + image.tobytes()).hexdigest()
    path = blobs / IMAGES / f"{digest}.png"
    if not path.exists():
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        _write_once(path, buffer.getvalue())
    return digest


def _write_once(path: Path, data: bytes) -> None:
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _read_list(column: pa.Array, meta: dict, blobs: Path, loaded: dict[str, Any]) -> list:
    from PIL import Image

    def blob(digest: str, kind: str):
        if digest not in loaded:
            if kind == "tensor":
                loaded[digest] = load_tensors((blobs / TENSORS / f"{digest}.safetensors").read_bytes())
            else:
                with Image.open(blobs / IMAGES / f"{digest}.png") as image:
                    loaded[digest] = image.copy()
        return loaded[digest]

    kind, rows, shared = meta["kind"], [], {}
    for text in column.to_pylist():
        value = json.loads(text)
        if value is None or kind == "json":
            rows.append(value)
            continue
        key = json.dumps(value)
        if key not in shared:  # one entry object per distinct content, as the batch shared it
            if kind in ("images", "image"):
                images = [blob(d, "image") for d in value]
                shared[key] = images if kind == "images" else images[0]
            else:
                tensors = blob(value, "tensor")
                shared[key] = tensors[""] if kind == "tensor" else dict(tensors)
        rows.append(shared[key])
    return rows
