"""The checkpoint format of `RLModule`, in one place: what a checkpoint holds besides Lightning's own entries,
which parameters are left out (frozen models, a LoRA policy's base: reloaded from their paths), how a file is
written (atomically) and how one is read back (``torch.load(weights_only=True)``: plain data only).

Entries an `RLModule` checkpoint adds:

    rng              every rank's random streams (sampling, the mini-batch shuffle), so a resumed run draws the same
    optimizer_steps  optimizer steps per parameter group (the LR schedules)
    hf_export        the architecture and tokenizer of each trained model (`lightning-rl export`)
    lora_base        weight fingerprints of a LoRA model's base, checked when the base is reloaded
"""

from __future__ import annotations

import dataclasses
import pathlib
import pickle
import tempfile
from pathlib import Path
from typing import Any

import torch

from lightning_rl.core.lora import is_lora

SAFE_GLOBALS = [pathlib.PosixPath, pathlib.PurePosixPath]
"""Types besides tensors and plain containers a checkpoint may hold (a path in a callback's state)."""


def safe_load(path: Path) -> dict[str, Any]:
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(
            f"{str(path)!r} holds Python objects that are not plain data, so it is not loaded (unpickling could run code). "
            f"Checkpoints written by lightning_rl never do; this one came from elsewhere or was altered. Details: {str(err).splitlines()[0]}"
        ) from None



def export_info(module) -> dict[str, Any]:
    """What an export needs besides the weights, stored in every ``RLModule`` checkpoint (``hf_export``)."""
    info: dict[str, Any] = {
        "policy": {"config": module.policy.config.to_dict(), "tokenizer": module.policy_spec.path, **dataclasses.asdict(module.policy_spec)},
    }
    if is_lora(module.policy):
        info["policy"]["base_fingerprint"] = module.policy.lora_base_fingerprint
    critic = module.critic
    if critic is not None and critic.backbone is not None:
        info["critic"] = {"config": critic.backbone.config.to_dict()}
        if is_lora(critic.backbone):
            reward_path = getattr(module.reward, "path", None)
            info["critic"].update(init_from=critic.init_from, path=critic.path, dtype=critic.dtype, lora=dataclasses.asdict(critic.lora))
            info["critic"].update(reward_path=reward_path, base_fingerprint=critic.backbone.lora_base_fingerprint)
    return info



def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint as one dict with a full ``state_dict`` (file, FSDP2 shard folder or DeepSpeed folder)."""
    path = Path(path)
    if path.is_file():
        return safe_load(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    if (path / "meta.pt").is_file() and (path / ".metadata").is_file():  # torch.distributed.checkpoint (FSDP2Strategy)
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

        weights: dict[str, Any] = {}
        _load_state_dict(weights, storage_reader=FileSystemReader(path), planner=_EmptyStateDictLoadPlanner(keys={"state_dict"}), no_dist=True)
        return {**safe_load(path / "meta.pt"), "state_dict": weights["state_dict"]}
    if (path / "latest").is_file() or (path / "checkpoint").is_dir():  # DeepSpeed
        from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

        with tempfile.TemporaryDirectory() as tmp:
            convert_zero_checkpoint_to_fp32_state_dict(path, Path(tmp) / "consolidated.ckpt")
            return safe_load(Path(tmp) / "consolidated.ckpt")
    raise ValueError(f"{str(path)!r} is a folder but neither an FSDP2Strategy checkpoint (meta.pt, .metadata) nor a DeepSpeed one (latest)")
