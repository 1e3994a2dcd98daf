"""Disk pushes: the policy saved as a Hugging Face checkpoint (config + safetensors) in a folder per version, which the
servers read; the folder of the version before is removed once the next one is served."""

from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path

import torch.distributed as dist
from torch import Tensor, nn

from lightning_rl.core.lora import is_lora, merged_state_dict

from .fingerprints import Fingerprints
from .ranks import rank


def full_state_dict(policy: nn.Module) -> dict[str, Tensor]:
    """Unsharded weights as the server names them (LoRA adapters merged); under torch.distributed a collective
    (every rank calls it), gathered to CPU."""
    if not (dist.is_available() and dist.is_initialized()):
        state = policy.state_dict()
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return merged_state_dict(policy, state) if is_lora(policy) else state


def save_checkpoint(policy: nn.Module, directory: str, fingerprints: Fingerprints | None = None) -> None:
    """Write ``policy`` as a Hugging Face checkpoint; rank 0 writes (and records what it wrote), every rank gathers."""
    state = full_state_dict(policy)
    if rank() == 0:
        policy.save_pretrained(directory, state_dict=state)
        if fingerprints is not None:
            from .buckets import checkpoint_tensors

            first = {id(t): k for k, t in reversed(state.items())}  # a tied tensor under its first name
            fingerprints.add(checkpoint_tensors(policy, {k: state[k] for k in first.values()}))


class WeightFolders:
    """``<weight_dir>/v<version>`` folders; without ``weight_dir`` a temporary folder of our own, removed on `close` and,
    when a failed run never closes the rollout, when the owner is collected or the process exits."""

    def __init__(self, weight_dir: str | None, owner: object, prefix: str):
        self.weight_dir, self._owner, self._prefix = weight_dir, weakref.ref(owner), prefix
        self.own: str | None = None

    def version(self, version: int | str) -> Path:
        if self.weight_dir is None and self.own is None:
            self.own = tempfile.mkdtemp(prefix=self._prefix)
            # a policy-sized copy: removed on close, and at exit when a failed run never closes the rollout
            weakref.finalize(self._owner(), shutil.rmtree, self.own, ignore_errors=True)
        return Path(self.weight_dir or self.own) / f"v{version}"

    def remove(self, version: int | str) -> None:
        shutil.rmtree(self.version(version), ignore_errors=True)

    def close(self) -> None:
        if self.own is not None:
            shutil.rmtree(self.own, ignore_errors=True)
            self.own = None
