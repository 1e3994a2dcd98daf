"""The checkpoint format of `RLModule`, in one place: what a checkpoint holds besides Lightning's own entries, which
parameters are left out (frozen models and a LoRA model's base are reloaded from their paths: each slot of the roster,
lightning_rl.roster, says which), the loop state that
travels with the weights, how a file is written (atomically, never with NaN/inf weights) and how one is read back
(``torch.load(weights_only=True)``: plain data only).

Entries an `RLModule` checkpoint adds to Lightning's (``state_dict``, optimizer states, loop progress, the data
module's position):

    rng              every rank's random streams (sampling, the mini-batch shuffle), so a resumed run draws the same
    optimizer_steps  optimizer steps per parameter group (the LR schedules)
    totals           samples and tokens trained on so far (TensorBoard's total/*, continued by a resumed run)
    hf_export        the architecture and tokenizer of each trained model (`lightning-rl export`)
    lora_base        weight fingerprints of a LoRA model's base, checked when the base is reloaded

In asynchronous training the data module's position is replaced by that of the first round not yet trained, so a
resumed run samples those prompts again (`save`).
"""

from __future__ import annotations

import os
import pathlib
import pickle
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import CheckpointIO, TorchCheckpointIO
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from lightning_rl.core.lora import check_base, is_lora
from lightning_rl.digests import CheckpointError, check_not_empty, checked, unreadable, with_digests
from lightning_rl.rng import IterationRNG, gather_rng_states, restore_rng_states
from lightning_rl.roster import ROSTER, policy_export_info  # noqa: F401 (the supervised recipe's policy entry)


@dataclass
class LoopState:
    """What the loop carries from one iteration to the next besides weights and optimizer states: the random streams
    (sampling; the mini-batch shuffle), the optimizer steps per parameter group and the samples and tokens so far.
    Saved in every checkpoint."""

    rng: IterationRNG = field(default_factory=IterationRNG)
    shuffle: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(0))
    optimizer_steps: dict[str, int] = field(default_factory=lambda: {"policy": 0, "critic": 0})
    totals: dict[str, float] = field(default_factory=lambda: {"samples": 0.0, "tokens": 0.0})
    trained: bool = False
    """Whether the iteration under way has completed its update (not saved): a failure after it saves that iteration
    as it is (lightning_rl.callbacks.fault), since its optimizer steps are done."""

    def snapshot(self) -> dict[str, Any]:
        """The state now (an iteration's start, to go back to when it is interrupted)."""
        return {
            "rng": self.rng.state,
            "shuffle": self.shuffle.get_state(),
            "optimizer_steps": dict(self.optimizer_steps),
            "totals": dict(self.totals),
        }

    def restore(self, snapshot: dict[str, Any]) -> None:
        if snapshot["rng"] is not None:
            self.rng.state = snapshot["rng"]
        self.shuffle.set_state(snapshot["shuffle"])
        self.optimizer_steps.clear()
        self.optimizer_steps.update(snapshot["optimizer_steps"])
        self.totals.update(snapshot.get("totals", {}))


# ---------------------------------------------------------------------------------------------- what is saved


@runtime_checkable
class Resumable(Protocol):
    """A LightningModule whose iterations resume exactly (an `RLModule`): its loop state is in its checkpoints."""

    loop_state: LoopState


def frozen_parameter_names(module: nn.Module) -> set[str]:
    """Names of the parameters that do not train, tied aliases included (as ``module.state_dict()`` names them)."""
    return {name for name, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad}


def lora_roots(module) -> dict[str, tuple[nn.Module | None, str, str | None]]:
    """{checkpoint key prefix: (model, config key, base path)} of an ``RLModule``'s models that may carry adapters."""
    return {
        slot.lora.prefix: (slot.lora.model(module), slot.key, slot.lora.base_path(module))
        for slot in ROSTER
        if slot.lora is not None
    }


def base_fingerprints(module) -> dict[str, list[float]]:
    """{prefix: fingerprint} of the LoRA models' bases, stored in checkpoints (``lora_base``)."""
    return {
        prefix: model.lora_base_fingerprint for prefix, (model, _, _) in lora_roots(module).items() if is_lora(model)
    }


def check_bases(stored: dict[str, list[float]] | None, module) -> None:
    """Raise, naming the config key, when a checkpoint's adapters were trained on another base than the one loaded."""
    for prefix, (model, what, path) in lora_roots(module).items():
        if is_lora(model):
            check_base((stored or {}).get(prefix), model, what, str(path))


def check_adapters(checkpoint: dict, module) -> None:
    """Raise, naming the config key, when a checkpoint's adapters do not fit this config's LoRA settings: another rank
    or other target modules (torch would list a size mismatch or an unexpected key per adapted layer), another alpha
    (the update silently scaled by another alpha / rank), adapters on a model now trained in full, or the reverse."""
    info, state = checkpoint.get("hf_export") or {}, checkpoint.get("state_dict")
    # {checkpoint key prefix: (the checkpoint's part, its LoRA spec now, the model now, config key)}
    parts = {
        slot.lora.prefix: (slot.name, slot.lora.spec(module), slot.lora.model(module), slot.lora.key)
        for slot in ROSTER
        if slot.lora is not None
    }
    for prefix, (part, spec, model, key) in parts.items():
        if part not in info:
            continue  # not in the checkpoint (no critic then), or a checkpoint without export info
        stored = info[part].get("lora")
        if stored is None and spec is not None:
            raise ValueError(
                f"{key}: the checkpoint's {part} was trained in full ({key}: null) and this config puts LoRA adapters on it: "
                f"resume without {key}, or start a new run from the exported model (lightning-rl export)"
            )
        if stored is None:
            continue
        settings = f"rank {stored['rank']}, alpha {stored['alpha']}, target_modules {stored['target_modules']}"
        if spec is None:
            raise ValueError(
                f"{key}: the checkpoint holds LoRA adapters ({settings}) and this config trains the {part} in full: set {key} to those settings to resume it"
            )
        differ = [
            f"{key}.{name}: {stored[name]} in the checkpoint, {getattr(spec, name)} in this config"
            for name in ("rank", "alpha")
            if stored[name] != getattr(spec, name)
        ]
        before = {k[len(prefix) :].split(".lora_")[0] for k in (state or {}) if k.startswith(prefix) and ".lora_" in k}
        now = (
            {n.split(".lora_")[0] for n, _ in model.named_parameters() if ".lora_" in n} if model is not None else set()
        )
        if before:  # the layers adapted, as the state names them: another spelling of the same targets is no change
            other_targets = before != now
        else:  # a sharded state, not loaded here: the settings as written
            other_targets = stored["target_modules"] != spec.target_modules
        if other_targets:
            only = (
                sorted({name.rsplit(".", 1)[-1] for name in before - now}),
                sorted({name.rsplit(".", 1)[-1] for name in now - before}),
            )
            where = (
                f" (adapters on {only[0]} only in the checkpoint, on {only[1]} only in this config)" if before else ""
            )
            differ.append(
                f"{key}.target_modules: {stored['target_modules']} in the checkpoint, {spec.target_modules} in this config{where}"
            )
        if differ:
            raise ValueError(
                f"{key}: the checkpoint's adapters do not fit this config: {'; '.join(differ)}. Resume with the checkpoint's "
                "settings, or start a new run (without --ckpt_path) to train new adapters"
            )


def frozen_base_names(module) -> set[str]:
    """Names (as in ``module.state_dict()``) of the frozen base parameters of LoRA models: left out of checkpoints."""
    names: set[str] = set()
    for prefix, (model, _, _) in lora_roots(module).items():
        if is_lora(model):
            names |= {prefix + n for n in frozen_parameter_names(model)}
    return names


def left_out(module) -> set[str]:
    """State-dict names an `RLModule` checkpoint does not store: the frozen parameters of the models reloaded from
    their paths (buffers stay: a reward model's running score statistics are state), and a LoRA model's frozen base.
    A reference refreshed during training (``kl.refresh_every``) is state, and stored."""
    reloaded = tuple(f"{slot.name}." for slot in ROSTER if slot.reloaded(module))
    return {name for name in frozen_parameter_names(module) if name.startswith(reloaded)} | frozen_base_names(module)


def save(module, checkpoint: dict[str, Any], datamodule: Any = None, untrained_position: dict | None = None) -> None:
    """Complete ``checkpoint`` (Lightning's, written before this) as the format above. Collective (the RNG states)."""
    state = checkpoint.get("state_dict", {})
    for key in left_out(module) & set(state):
        del state[key]
    checkpoint["rng"] = gather_rng_states(module.loop_state.rng, {"shuffle": module.loop_state.shuffle})
    checkpoint["optimizer_steps"] = dict(module.loop_state.optimizer_steps)
    checkpoint["totals"] = dict(module.loop_state.totals)
    checkpoint["hf_export"] = export_info(module)
    checkpoint["lora_base"] = base_fingerprints(module)
    key = type(datamodule).__qualname__
    if untrained_position is not None and key in checkpoint:  # asynchronous rounds sampled ahead are sampled again
        checkpoint[key] = dict(untrained_position)


def load(module, checkpoint: dict[str, Any]) -> None:
    """Read back what `save` wrote: the left-out weights are taken from the models as loaded, the loop state restored."""
    state = checkpoint.get("state_dict")
    check_bases(checkpoint.get("lora_base"), module)
    check_adapters(checkpoint, module)  # before torch lists a size mismatch per adapted layer
    if state is not None:
        lora_base = frozen_base_names(module)
        # every slot that never trains, stored or not: a run that refreshed its reference stored it, one that did not
        frozen = tuple(f"{slot.name}." for slot in ROSTER if not slot.trains)
        for key, value in module.state_dict().items():
            if key.startswith(frozen) or key in lora_base:
                state.setdefault(key, value)
    module.loop_state.optimizer_steps.update(checkpoint.get("optimizer_steps", {}))
    module.loop_state.totals.update(checkpoint.get("totals", {}))  # a checkpoint of an older version counts from 0
    if checkpoint.get("rng"):
        restore_rng_states(checkpoint["rng"], module.loop_state.rng, {"shuffle": module.loop_state.shuffle})


def export_info(module) -> dict[str, Any]:
    """What an export needs besides the weights, stored in every ``RLModule`` checkpoint (``hf_export``): one entry per
    exported slot of the roster the module holds."""
    entries = {slot.name: slot.export_info(module) for slot in ROSTER if slot.export_info is not None}
    return {name: entry for name, entry in entries.items() if entry is not None}


# ---------------------------------------------------------------------------------------------- writing


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoint files that are either the previous save or the new one, never a torn mix.

    ``torch.save`` streams into a hidden temporary file next to the target, which is flushed to disk
    and then ``os.replace``d over it (atomic on POSIX). Lightning's default buffers the whole checkpoint
    in memory and, when the system temp folder is on another filesystem than the checkpoint (usual on
    clusters), copies it into place: a crash during that copy leaves a truncated ``last.ckpt``.
    Remote paths (``s3://`` ...) are left to Lightning's default. Temporary files of this naming left by
    a process that was killed mid-save are removed at the next save into the same folder.

    Every tensor is written with its digest and checked when the file is read (lightning_rl.digests): a damaged
    tensor is named, never trained on; an empty file is one line.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        checkpoint = with_digests(checkpoint)
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

    def load_checkpoint(self, path, map_location=lambda storage, loc: storage, weights_only=None) -> dict[str, Any]:
        source = f"checkpoint {str(path)!r}"
        if isinstance(get_filesystem(path), LocalFileSystem):
            check_not_empty(Path(path))
        try:
            checkpoint = super().load_checkpoint(path, map_location, weights_only)
        except RuntimeError as err:
            raise unreadable(source, err) from None
        return checked(checkpoint, source)


def with_atomic_checkpoints(plugins) -> list:
    """Trainer ``plugins`` (None, one, or a list) with `AtomicCheckpointIO`, unless they bring their own CheckpointIO."""
    plugins = list(plugins) if isinstance(plugins, list) else [] if plugins is None else [plugins]
    if not any(isinstance(p, CheckpointIO) for p in plugins):
        plugins.append(AtomicCheckpointIO())
    return plugins


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


def non_finite_entries(state: dict[str, Any]) -> list[str]:
    """Names of the floating-point tensors of ``state`` that hold a NaN or inf."""
    bad = []
    for name, value in state.items():
        local = value.to_local() if isinstance(value, DTensor) else value  # a DTensor shard: each rank checks its own
        if isinstance(local, Tensor) and local.is_floating_point() and not bool(torch.isfinite(local).all()):
            bad.append(name)
    return bad


def replace_path(new: Path, path: Path) -> None:
    """Put ``new`` (file or folder) at ``path``; whatever was at ``path`` is removed only once ``new`` is in place."""
    if not path.exists():
        os.replace(new, path)
        return
    old = path.with_name(f".{path.name}.old")
    if old.exists():
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    os.replace(path, old)
    os.replace(new, path)
    shutil.rmtree(old) if old.is_dir() else old.unlink()


# ---------------------------------------------------------------------------------------------- reading


SAFE_GLOBALS = [pathlib.PosixPath, pathlib.PurePosixPath]
"""Types besides tensors and plain containers a checkpoint may hold (a path in a callback's state)."""


def safe_load(path: Path, digested: bool = True) -> dict[str, Any]:
    """A checkpoint file read as plain data; ``digested``: written by `AtomicCheckpointIO`, its tensors checked against
    their digests (a file of Lightning's own writing, an FSDP2 folder's metadata, holds none)."""
    check_not_empty(path)
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"{str(path)!r} holds Python objects that are not plain data, so it is not loaded (unpickling could run code). "
            f"Checkpoints written by lightning_rl never do; this one came from elsewhere or was altered. Details: {str(err).splitlines()[0]}"
        ) from None
    except RuntimeError as err:
        raise unreadable(f"checkpoint {str(path)!r}", err) from None
    return checked(checkpoint, f"checkpoint {str(path)!r}") if digested else checkpoint


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
        _load_state_dict(
            weights,
            storage_reader=FileSystemReader(path),
            planner=_EmptyStateDictLoadPlanner(keys={"state_dict"}),
            no_dist=True,
        )
        return {**safe_load(path / "meta.pt", digested=False), "state_dict": weights["state_dict"]}
    if (path / "latest").is_file() or (path / "checkpoint").is_dir():  # DeepSpeed
        from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

        with tempfile.TemporaryDirectory() as tmp:
            convert_zero_checkpoint_to_fp32_state_dict(path, Path(tmp) / "consolidated.ckpt")
            return safe_load(Path(tmp) / "consolidated.ckpt", digested=False)
    raise ValueError(
        f"{str(path)!r} is a folder but neither an FSDP2Strategy checkpoint (meta.pt, .metadata) nor a DeepSpeed one (latest)"
    )
