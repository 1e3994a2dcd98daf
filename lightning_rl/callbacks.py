"""Trainer plumbing: checkpoint files written atomically, and a Hugging Face export at the end of ``fit``.

    trainer:
      plugins: [lightning_rl.callbacks.AtomicCheckpointIO]     # the CLI adds it when no CheckpointIO is given
      callbacks:
        - class_path: lightning_rl.callbacks.HFExport
          init_args: {dirpath: runs/grpo/hf}
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import torch
from lightning import Callback
from lightning.fabric.utilities.cloud_io import get_filesystem
from fsspec.implementations.local import LocalFileSystem
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lightning_rl.distributed import replace_path, trainable_state_dict
from lightning_rl.checkpoint import export_info
from lightning_rl.cli.export import export_state
from lightning_rl.core.models import _DTYPES


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoint files that are either the previous save or the new one, never a torn mix.

    ``torch.save`` streams into a hidden temporary file next to the target, which is flushed to disk
    and then ``os.replace``d over it (atomic on POSIX). Lightning's default buffers the whole checkpoint
    in memory and, when the system temp folder is on another filesystem than the checkpoint (usual on
    clusters), copies it into place: a crash during that copy leaves a truncated ``last.ckpt``.
    Remote paths (``s3://`` ...) are left to Lightning's default. Temporary files of this naming left by
    a process that was killed mid-save are removed at the next save into the same folder.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or not isinstance(get_filesystem(path), LocalFileSystem):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale_temporaries(path.parent)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            if path.is_dir():  # a sharded checkpoint of an earlier run under the same name
                replace_path(tmp, path)
            else:
                os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)


def sweep_stale_temporaries(folder: Path) -> list[Path]:
    """Remove ``.<name>.tmp-<pid>`` files (our naming) whose writer is no longer running; returns them."""
    removed = []
    for tmp in folder.glob(".*.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if tmp.is_file() and pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class HFExport(Callback):
    """At the end of ``fit``, write the policy (and critic) with ``save_pretrained`` (see ``lightning_rl.cli.export``)."""

    def __init__(self, dirpath: str = "runs/hf", dtype: Literal["float32", "bfloat16", "float16"] | None = None):
        """
        Args:
            dirpath: folder for ``policy/`` (and ``critic/``), each loadable with ``from_pretrained``.
            dtype: cast the weights on export (None = as trained).
        """
        self.dirpath, self.dtype = dirpath, dtype

    def on_fit_end(self, trainer, pl_module) -> None:
        state = trainable_state_dict(trainer, pl_module)  # collective under FSDP2 / ZeRO-3: every rank calls it
        if trainer.is_global_zero:
            export_state(state, export_info(pl_module), self.dirpath, _DTYPES[self.dtype] if self.dtype else None)
        trainer.strategy.barrier("lightning_rl_hf_export")
