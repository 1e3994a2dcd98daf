"""A checkpoint file checked as it is read: a sha256 digest of every tensor it holds, written into the file with it;
an empty or torn file named in one line.

A bit flipped on disk or in a copy (a torn transfer, a bad sector) changes a weight or an optimizer moment without
any error: ``torch.load`` does not check the zip archive's CRCs, and a resumed run trains on from the damaged value.
Each tensor is hashed with its dtype and shape, under its path in the checkpoint (``state_dict/policy.lm_head.weight``,
``optimizer_states/0/state/3/exp_avg``); on reading, the first tensor whose bytes differ from its digest is named.

Cost: sha256 reads every byte once at each save and each load, on up to 8 threads (hashlib releases the GIL); about
as long as ``torch.save`` itself on one thread (measured in docs/performance.md#checkpoints). Checkpoints written before
the digests load unchecked, with one warning saying so.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

DIGESTS = "tensor_digests"
"""The checkpoint entry: {tensor path: sha256 hex of its dtype, shape and bytes}."""


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used as it is, named with the fix (the command line prints it as one line)."""


def tensors(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Tensor]]:
    """(path, tensor) of every tensor in a checkpoint's nested dicts, lists and tuples, in order."""
    if isinstance(value, Tensor):
        yield "/".join(path), value
    elif isinstance(value, dict):
        for key, item in value.items():
            if not path and key == DIGESTS:
                continue
            yield from tensors(item, (*path, str(key)))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from tensors(item, (*path, str(i)))


def digest(tensor: Tensor) -> str:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor  # a DTensor: this rank's shard
    data = local.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy()  # (bytes,)
    sha = hashlib.sha256(f"{local.dtype}{tuple(local.shape)}".encode())
    sha.update(data)
    return sha.hexdigest()


def digests(checkpoint: dict[str, Any]) -> dict[str, str]:
    """{path: digest} of every tensor of ``checkpoint``."""
    named = list(tensors(checkpoint))
    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        return dict(zip([name for name, _ in named], pool.map(digest, [t for _, t in named])))


def with_digests(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """``checkpoint`` with its tensors' digests, as it is written."""
    return {**checkpoint, DIGESTS: digests(checkpoint)}


def checked(checkpoint: dict[str, Any], source: str) -> dict[str, Any]:
    """``checkpoint`` as read from ``source``, without its digests once every tensor matches them; `CheckpointError`
    naming the first tensor that does not. A checkpoint written before the digests is returned with a warning."""
    stored = checkpoint.pop(DIGESTS, None) if isinstance(checkpoint, dict) else None
    if stored is None:
        warnings.warn(
            f"{source} holds no tensor digests (written before lightning_rl checked them): loaded unchecked, a damaged "
            "tensor in it would go unnoticed"
        )
        return checkpoint
    found = digests(checkpoint)
    differ = [name for name, value in found.items() if stored.get(name) != value]
    missing = sorted(set(stored) - set(found))
    if differ or missing:
        first = differ[0] if differ else missing[0]
        what = "does not match the digest written with it" if differ else "is missing"
        count = len(differ) + len(missing)
        raise CheckpointError(
            f"{source}: tensor {first} {what}{f' ({count} tensors in all)' if count > 1 else ''}: the file was damaged "
            "after it was written (a flipped bit, a torn copy). Resume from another checkpoint (an earlier save, or the "
            "original of a copy)"
        )
    return checkpoint


def check_not_empty(path: Path) -> None:
    if path.is_file() and path.stat().st_size == 0:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is empty (0 bytes): the save or copy that wrote it did not finish (a full disk, a "
            "killed process). Resume from another checkpoint"
        )


def unreadable(source: str, err: RuntimeError) -> CheckpointError:
    """``torch.load``'s error on a file that is not a whole checkpoint (a torn zip archive), as one line."""
    return CheckpointError(
        f"{source} is not a whole checkpoint ({str(err).splitlines()[0]}): a save or copy that did not finish, or "
        "another kind of file. Resume from another checkpoint"
    )
