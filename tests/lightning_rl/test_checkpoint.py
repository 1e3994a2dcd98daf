"""Atomic checkpoints: a crash in the middle of a save leaves the previous checkpoint whole and loadable."""

from __future__ import annotations

import os

import pytest
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

import lightning_rl.checkpoint as callbacks_module
from lightning_rl.checkpoint import AtomicCheckpointIO
from lightning_rl.distributed import FSDP2Strategy

from .cli_runs import cli_args, run_cli

TORCH_SAVE = torch.save  # the real one, kept before tests patch it
CHECKPOINT_V1 = {"state_dict": {"w": torch.arange(100_000, dtype=torch.float32)}, "global_step": 1}
CHECKPOINT_V2 = {"state_dict": {"w": torch.ones(100_000)}, "global_step": 2}


def torn_save(obj, f, *args, **kwargs):
    """torch.save that dies half way through writing (disk full, node killed...)."""
    import io

    buffer = io.BytesIO()
    TORCH_SAVE(obj, buffer)
    data = buffer.getvalue()
    f.write(data[: len(data) // 2])
    f.flush()
    raise OSError("simulated crash during the save")


def test_crash_during_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint(CHECKPOINT_V1, path)
    monkeypatch.setattr(callbacks_module.torch, "save", torn_save)
    with pytest.raises(OSError, match="simulated crash"):
        io.save_checkpoint(CHECKPOINT_V2, path)
    monkeypatch.undo()
    loaded = torch.load(path)
    assert loaded["global_step"] == 1 and torch.equal(loaded["state_dict"]["w"], CHECKPOINT_V1["state_dict"]["w"])
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]  # no temporary file left behind
    io.save_checkpoint(CHECKPOINT_V2, path)  # and the next save goes through
    assert torch.load(path)["global_step"] == 2


def test_lightning_default_tears_the_file_when_the_temp_folder_is_another_filesystem(tmp_path, monkeypatch):
    """Why the default is replaced: fsspec writes to the system temp folder and moves the file into place; across
    filesystems (usual on clusters) the move is a copy, and a crash during it leaves half a checkpoint."""
    import fsspec.implementations.local as local

    path = tmp_path / "last.ckpt"
    TorchCheckpointIO().save_checkpoint(CHECKPOINT_V1, path)

    def cross_device_move(src, dst):  # shutil.move falls back to copying when os.rename fails with EXDEV
        with open(src, "rb") as f:
            data = f.read()
        with open(dst, "wb") as f:
            f.write(data[: len(data) // 2])
        raise OSError("simulated crash during the copy")

    monkeypatch.setattr(local.shutil, "move", cross_device_move)
    with pytest.raises(OSError):
        TorchCheckpointIO().save_checkpoint(CHECKPOINT_V2, path)
    monkeypatch.undo()
    with pytest.raises(Exception):
        torch.load(path)
    # the same failure point cannot reach AtomicCheckpointIO, which never moves across filesystems
    AtomicCheckpointIO().save_checkpoint(CHECKPOINT_V1, path)
    monkeypatch.setattr(local.shutil, "move", cross_device_move)
    AtomicCheckpointIO().save_checkpoint(CHECKPOINT_V2, path)
    assert torch.load(path)["global_step"] == 2


def test_sharded_checkpoint_folder_is_swapped_in_only_when_complete(tmp_path, monkeypatch):
    """FSDP2Strategy writes the folder of shards next to the target and swaps it in after every rank has written."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    target = tmp_path / "last.ckpt"
    target.mkdir()
    (target / "meta.pt").write_bytes(b"previous")
    (target / "__0_0.distcp").write_bytes(b"previous shard")

    def crash_mid_write(self, checkpoint, filepath, storage_options=None):
        filepath.mkdir(parents=True, exist_ok=True)
        (filepath / "__0_0.distcp").write_bytes(b"half")
        raise OSError("simulated crash during the save")

    strategy = FSDP2Strategy()  # no process group: broadcast and barrier are identities
    monkeypatch.setattr(ModelParallelStrategy, "save_checkpoint", crash_mid_write)
    with pytest.raises(OSError, match="simulated crash"):
        strategy.save_checkpoint({}, target)
    assert (target / "meta.pt").read_bytes() == b"previous" and (
        target / "__0_0.distcp"
    ).read_bytes() == b"previous shard"

    def complete_write(self, checkpoint, filepath, storage_options=None):
        filepath.mkdir(parents=True, exist_ok=True)
        (filepath / "meta.pt").write_bytes(b"new")
        (filepath / "__0_0.distcp").write_bytes(b"new shard")

    monkeypatch.setattr(ModelParallelStrategy, "save_checkpoint", complete_write)
    strategy.save_checkpoint({}, target)  # a leftover .tmp folder from the crash is cleared first
    assert (target / "meta.pt").read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


@pytest.mark.slow
def test_training_crash_during_a_save_resumes_from_the_previous_checkpoint(tmp_path, tiny_model_path, monkeypatch):
    """End to end: the CLI writes checkpoints with AtomicCheckpointIO; the save at iteration 4 dies half way through."""
    args = cli_args(tmp_path, tiny_model_path, 4, "--data.val_data=null")  # a checkpoint every 2 iterations
    saves = []

    def second_save_crashes(obj, f, *a, **k):
        saves.append(obj["global_step"])
        return torn_save(obj, f) if len(saves) >= 2 else TORCH_SAVE(obj, f, *a, **k)  # the disk stays broken

    monkeypatch.setattr(callbacks_module.torch, "save", second_save_crashes)
    with pytest.raises(OSError, match="simulated crash"):
        run_cli("fit", args)
    monkeypatch.undo()
    assert saves == [2, 4, 4]  # the cadence save, then the exception handler's retry of the last iteration
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == 2
    resumed = run_cli("fit", [*args, f"--ckpt_path={last}"])
    assert isinstance(resumed.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    assert resumed.trainer.global_step == 4 and torch.load(last, weights_only=False)["global_step"] == 4


def test_temporary_files_of_killed_saves_are_swept_at_the_next_save(tmp_path):
    """A kill -9 during a save leaves ``.last.ckpt.tmp-<pid>``; the next save removes those whose writer is gone."""
    import subprocess
    import sys

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    stale = folder / f".last.ckpt.tmp-{dead}"
    alive = folder / f".step=2.ckpt.tmp-{os.getppid()}"  # a save still being written by a running process
    foreign = folder / ".notes.tmp-x"  # not our naming
    for f in (stale, alive, foreign):
        f.write_bytes(b"partial")
    AtomicCheckpointIO().save_checkpoint(CHECKPOINT_V1, folder / "last.ckpt")
    assert sorted(p.name for p in folder.iterdir()) == sorted(["last.ckpt", alive.name, foreign.name])
