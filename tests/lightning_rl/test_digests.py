"""A checkpoint file checked as it is read (lightning_rl.digests): a flipped bit in a weight or an optimizer moment is
named before anything trains on it, through Lightning's resume and ``lightning-rl export`` alike; a checkpoint written
before the digests loads with one warning; an empty or torn file is one line."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from lightning import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_rl.checkpoint import AtomicCheckpointIO, load_checkpoint
from lightning_rl.digests import DIGESTS, CheckpointError, digests

MARK = torch.full((64,), 1.2345, dtype=torch.float32)  # bytes found once in the file, to flip a bit of


def flip_a_bit(path: Path, pattern: bytes, bit: int = 3) -> None:
    data = bytearray(path.read_bytes())
    at = data.find(pattern)
    assert at >= 0 and data.find(pattern, at + 1) < 0
    data[at + 17] ^= 1 << bit
    path.write_bytes(bytes(data))


def saved(tmp_path: Path) -> Path:
    path = tmp_path / "last.ckpt"
    state = {"state_dict": {"policy.lm_head.weight": MARK.clone(), "policy.norm.weight": torch.ones(8)},
             "optimizer_states": [{"state": {0: {"exp_avg": torch.zeros(3)}}}], "global_step": 3}  # fmt: skip
    AtomicCheckpointIO().save_checkpoint(state, path)
    return path


def test_every_tensor_is_written_with_its_digest_and_read_back_checked(tmp_path):
    path = saved(tmp_path)
    stored = torch.load(path, weights_only=True)[DIGESTS]
    assert sorted(stored) == ["optimizer_states/0/state/0/exp_avg", "state_dict/policy.lm_head.weight",
                              "state_dict/policy.norm.weight"]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for loaded in (AtomicCheckpointIO().load_checkpoint(path), load_checkpoint(path)):
            assert DIGESTS not in loaded and torch.equal(loaded["state_dict"]["policy.lm_head.weight"], MARK)
    # dtype and shape are part of a digest: the same bytes under another shape differ
    assert digests({"w": torch.zeros(4)}) != digests({"w": torch.zeros(2, 2)})


def test_a_flipped_bit_is_named_with_its_tensor(tmp_path):
    path = saved(tmp_path)
    flip_a_bit(path, MARK.numpy().tobytes())
    for read in (AtomicCheckpointIO().load_checkpoint, load_checkpoint):  # Lightning's resume; export
        with pytest.raises(CheckpointError) as damaged:
            read(path)
        message = str(damaged.value)
        assert message.startswith(f"checkpoint {str(path)!r}: tensor state_dict/policy.lm_head.weight does not match")
        assert "\n" not in message and "Resume from another checkpoint" in message


def test_a_checkpoint_written_before_the_digests_loads_with_one_warning(tmp_path):
    path = tmp_path / "old.ckpt"
    torch.save({"state_dict": {"w": torch.ones(2)}, "global_step": 1}, path)
    with pytest.warns(UserWarning, match=r"holds no tensor digests .*: loaded unchecked") as said:
        loaded = AtomicCheckpointIO().load_checkpoint(path)
    assert len(said) == 1 and loaded["global_step"] == 1


def test_an_empty_or_torn_file_is_one_line(tmp_path):
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    for read in (AtomicCheckpointIO().load_checkpoint, load_checkpoint):
        with pytest.raises(
            CheckpointError, match=r"is empty \(0 bytes\): the save or copy that wrote it did not finish"
        ):
            read(empty)
    torn = tmp_path / "torn.ckpt"
    torn.write_bytes(saved(tmp_path).read_bytes()[:-200])
    with pytest.raises(CheckpointError, match=r"is not a whole checkpoint \(.*zip archive"):
        AtomicCheckpointIO().load_checkpoint(torn)


class AdamModel(BoringModel):
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.1)


@pytest.mark.slow
def test_resuming_from_a_damaged_checkpoint_names_the_tensor_before_training(tmp_path):
    """Through Lightning's resume: the optimizer moment with a flipped bit is named, no step runs."""

    def trainer(steps: int) -> Trainer:
        return Trainer(
            max_steps=steps, logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
            limit_val_batches=0, default_root_dir=tmp_path, plugins=[AtomicCheckpointIO()],
            callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=2, save_top_k=0)],
        )  # fmt: skip

    trainer(2).fit(AdamModel())
    path = tmp_path / "last.ckpt"
    checkpoint = torch.load(path, weights_only=False)
    moment = checkpoint["optimizer_states"][0]["state"][0]["exp_avg"]
    assert moment.abs().sum() > 0
    flip_a_bit(path, moment.numpy().tobytes()[:32], bit=1)
    with pytest.raises(CheckpointError, match=r"tensor optimizer_states/0/state/0/exp_avg does not match"):
        trainer(4).fit(AdamModel(), ckpt_path=path)
