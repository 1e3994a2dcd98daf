"""Plumbing for data-parallel and sharded training: FSDP2 sharding and its strategy, DDP and DeepSpeed details, per-rank RNG.

Every strategy trains the same way: each rank holds different prompts (a group never spans
ranks), losses are normalised by all-reduced token counts, and gradients are averaged over
ranks by the strategy (DDP all-reduce, FSDP2 reduce-scatter, DeepSpeed ZeRO).

* FSDP2 (``FSDP2Strategy``, configs/strategy/fsdp.yaml): ``RLModule.configure_model`` calls
  ``shard_models``, which applies ``fully_shard`` to every transformer block (the HF model's
  ``_no_split_modules``) and then to the model's root, for the policy, the critic, the frozen
  reference and reward models (sharding a frozen model only saves memory: its forward all-gathers like
  the policy's).
  Generation runs on the sharded policy: every rank must run the same number of forward passes, so
  the policy is marked FSDP-managed and ``HFRollout`` keeps ranks that finished stepping until all have.
* DDP: critic pretraining runs no policy forward; ``touch`` gives the policy zero gradients so DDP's
  reducer sees every parameter without ``find_unused_parameters`` (the module then drops them).
* DeepSpeed: one optimizer (actor and critic are parameter groups); gradient clipping belongs to
  its config (``gradient_clipping``), so the module does not clip by hand (``uses_deepspeed``).
"""

from __future__ import annotations

import os
import shutil
import warnings
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import Tensor, nn

from lightning_rl.core.ops import dist_ready

# ---------------------------------------------------------------------------------------------- FSDP2


def fsdp_mesh(device_mesh):
    """The mesh ``fully_shard`` uses: every dimension of the strategy's mesh is data parallel here.

    Lightning's mesh is (``data_parallel``, ``tensor_parallel``); models are not tensor-parallel, so
    parameters are sharded over the second dimension and replicated over the first (HSDP when both
    are larger than 1).
    """
    replicate, shard = device_mesh["data_parallel"].size(), device_mesh["tensor_parallel"].size()
    if replicate > 1 and shard > 1:
        return device_mesh  # 2-D: replicate over dim 0, shard over dim 1
    return device_mesh["data_parallel"] if replicate > 1 else device_mesh["tensor_parallel"]


def shard(model: nn.Module, mesh, blocks_of: nn.Module | None = None) -> nn.Module:
    """``fully_shard`` each transformer block of ``blocks_of`` (default ``model``), then ``model`` itself."""
    from torch.distributed.fsdp import fully_shard

    source = model if blocks_of is None else blocks_of
    names = set(getattr(source, "_no_split_modules", None) or [])
    if not names:
        raise ValueError(
            f"{type(source).__name__} lists no `_no_split_modules`, so its transformer blocks are unknown: "
            "FSDP2 would shard it as one unit (no memory saving); use configs/strategy/ddp.yaml or a transformers model that lists them"
        )
    for module in source.modules():
        if type(module).__name__ in names:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def shard_models(module) -> None:
    """Shard the policy, the critic, the reference and reward models of an ``RLModule`` over its device mesh (idempotent)."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(module.policy, FSDPModule):
        return
    strategy = module._trainer.strategy if module._trainer is not None else None
    if strategy is not None and not isinstance(strategy, FSDP2Strategy):
        raise ValueError(
            f"trainer.strategy is {type(strategy).__name__}: for FSDP2 use lightning_rl.distributed.FSDP2Strategy "
            "(configs/strategy/fsdp.yaml), whose checkpoints leave out the frozen models and reload them"
        )
    mesh = fsdp_mesh(module.device_mesh)
    shard(module.policy, mesh)
    # HFRollout (and transformers' generate, as synced_gpus) keeps ranks stepping together for modules with this flag
    module.policy._is_fsdp_managed_module = True
    if module.reference is not None:
        shard(module.reference, mesh)
    if module.critic is not None:
        shard(module.critic, mesh, blocks_of=module.critic.backbone)
    for reward in {id(r): r for r in (module.reward, module.val_reward)}.values():
        if isinstance(getattr(reward, "model", None), nn.Module):  # RewardModel: called once per round on every rank
            from components.reward.model import scalar_head

            # it calls the backbone and the scalar head itself, not the classifier's forward: the backbone is the
            # unit to shard (its root hooks gather the embeddings); the one-row head stays replicated
            backbone, _ = scalar_head(reward.model)
            shard(backbone, mesh)


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` for FSDP2 (``fully_shard``) of the RL models, with checkpoints that
    leave out frozen models and are replaced atomically.

    Checkpoints are folders of shards (``torch.distributed.checkpoint``) plus ``meta.pt``. Frozen models
    (reference, reward) are reloaded from their paths, so they are neither saved nor expected on load.
    A save writes ``.<name>.tmp`` and swaps it in when every rank has finished: a crash during a save
    leaves the previous checkpoint whole. ``python -m lightning_rl.cli.export`` turns a folder into a
    Hugging Face model.
    """

    def __init__(
        self,
        sharding: Literal["all", "node"] = "all",
        process_group_backend: str | None = None,
        timeout: timedelta | None = timedelta(minutes=30),
    ):
        """
        Args:
            sharding: ``all`` shards every model over all ranks (least memory); ``node`` shards within a node
                and replicates across nodes (HSDP: less inter-node traffic, a full copy per node).
            process_group_backend: nccl / gloo (None = the default for the device).
            timeout: collective timeout (generation and rewards run between collectives: keep it generous).
        """
        if sharding not in ("all", "node"):
            raise ValueError(f"FSDP2Strategy: sharding must be 'all' or 'node', got {sharding!r}")
        super().__init__(save_distributed_checkpoint=True, process_group_backend=process_group_backend, timeout=timeout)
        self.sharding = sharding

    def setup_environment(self) -> None:
        # the mesh is (replicate, shard); ModelParallelStrategy builds it from these two sizes
        world = self.num_nodes * self.num_processes
        self._data_parallel_size, self._tensor_parallel_size = (1, world) if self.sharding == "all" else (self.num_nodes, self.num_processes)
        super().setup_environment()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # every rank is a data-parallel rank (no tensor parallelism): validation prompts are split over all of them
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def lightning_module_state_dict(self) -> dict[str, Any]:
        return self._trainable_state(cpu_offload=True)

    def _trainable_state(self, cpu_offload: bool = False) -> dict[str, Any]:
        """The sharded state dict without frozen parameters (tied aliases included, which ``ignore_frozen_params`` keeps)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        frozen = {name for name, p in self.model.named_parameters(remove_duplicate=False) if not p.requires_grad}
        state = get_model_state_dict(self.model, options=StateDictOptions(cpu_offload=cpu_offload, ignore_frozen_params=True))
        return {k: v for k, v in state.items() if k not in frozen}

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None) -> None:
        path = Path(self.broadcast(str(filepath)))
        tmp = path.with_name(f".{path.name}.tmp")
        if self.global_rank == 0 and tmp.exists():
            shutil.rmtree(tmp)
        self.barrier("lightning_rl_save_start")
        super().save_checkpoint(checkpoint, tmp, storage_options)
        self.barrier("lightning_rl_save_written")  # every shard is on disk before the swap
        if self.global_rank == 0:
            replace_path(tmp, path)
        self.barrier("lightning_rl_save_done")

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        import torch.distributed.checkpoint as dcp
        from lightning.fabric.strategies.model_parallel import _METADATA_FILENAME
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict

        path = Path(self.broadcast(str(checkpoint_path)))
        if not (path / _METADATA_FILENAME).is_file():
            raise FileNotFoundError(f"{path} is not a checkpoint folder written by FSDP2Strategy (no {_METADATA_FILENAME} in it)")
        # only the trainable state is in the checkpoint; frozen models keep the weights loaded from their paths
        state = {"state_dict": self._trainable_state()}
        dcp.load(state, checkpoint_id=path)
        set_model_state_dict(self.model, state["state_dict"], options=StateDictOptions(strict=False))
        for i, optimizer in enumerate(self.optimizers):
            optim_state = {f"optimizer_{i}": get_optimizer_state_dict(self.model, optimizer)}
            dcp.load(optim_state, checkpoint_id=path)
            set_optimizer_state_dict(self.model, optimizer, optim_state_dict=optim_state[f"optimizer_{i}"], options=StateDictOptions(cpu_offload=True))
        return torch.load(path / _METADATA_FILENAME, weights_only=weights_only)


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


# ---------------------------------------------------------------------------------------------- DDP / DeepSpeed


def uses_ddp(trainer) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return trainer is not None and isinstance(trainer.strategy.model, DistributedDataParallel)


def uses_deepspeed(trainer) -> bool:
    from lightning.pytorch.strategies import DeepSpeedStrategy

    return trainer is not None and isinstance(trainer.strategy, DeepSpeedStrategy)


def hf_zero3_config(trainer):
    """Under DeepSpeed ZeRO-3, the transformers-side config (the caller keeps it alive), else None.

    While it lives, ``from_pretrained`` loads weights into ZeRO-3's partitioned parameters and
    ``HFRollout`` keeps ranks in step (``is_deepspeed_zero3_enabled``), as for FSDP2.
    """
    if not uses_deepspeed(trainer) or not trainer.strategy.zero_stage_3:
        return None
    from transformers.integrations import HfDeepSpeedConfig

    return HfDeepSpeedConfig(trainer.strategy.config)


def touch(module: nn.Module) -> Tensor:
    """A zero that depends on every trainable parameter of ``module``.

    Added to a loss, it gives those parameters gradients of zeros: DDP's reducer expects a gradient
    for every parameter in each backward and fails on the next one if a forward skipped a module.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    return torch.stack([p.reshape(-1)[0].float() for p in params]).sum() * 0.0


def trainable_state_dict(trainer, module: nn.Module) -> dict[str, Tensor]:
    """Full (unsharded) CPU tensors of every trainable parameter and every buffer, on global rank 0 ({} elsewhere).

    Collective under FSDP2 and DeepSpeed ZeRO-3: every rank must call it.
    """
    trainable = {name for name, p in module.named_parameters() if p.requires_grad}
    frozen = {name for name, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad}
    if any(type(p).__name__ == "DTensor" for p in module.parameters()):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        state = get_model_state_dict(module, options=options)
        return {k: v for k, v in state.items() if k not in frozen}  # tied aliases of frozen weights survive ignore_frozen_params
    if uses_deepspeed(trainer) and getattr(trainer.strategy, "zero_stage_3", False):
        import deepspeed

        params = [p for name, p in module.named_parameters() if name in trainable]
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return _cpu_copy(module.state_dict(), frozen) if trainer.is_global_zero else {}
    return _cpu_copy(module.state_dict(), frozen) if trainer is None or trainer.is_global_zero else {}


def _cpu_copy(state: dict[str, Tensor], skip: set[str]) -> dict[str, Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items() if k not in skip}


# ---------------------------------------------------------------------------------------------- RNG


def _global_state() -> dict[str, Tensor]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_global_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]  # older checkpoints hold every device's state
        torch.cuda.set_rng_state_all(cuda) if isinstance(cuda, (list, tuple)) else torch.cuda.set_rng_state(cuda)


class IterationRNG:
    """torch's global random state as the RL iterations see it, kept apart from every other user.

    Sampling (``generate``) draws from torch's global generator, and so does Lightning between
    iterations (a DataLoader's base seed when validation starts, ...). ``scope`` swaps this
    stream in for one iteration and the rest of the world's back out, so a run resumed from a
    checkpoint (which stores ``state``) samples exactly what the original run sampled.
    On its first use on rank r > 0 the stream is reseeded with (seed + r): every rank starts from the
    same seed (``seed_everything``, or torch's fixed default) and would otherwise draw the same noise.
    """

    def __init__(self) -> None:
        self.state: dict[str, Tensor] | None = None

    @contextmanager
    def scope(self, rank: int):
        outside = _global_state()
        if self.state is not None:
            _set_global_state(self.state)
        elif rank > 0:
            torch.manual_seed((torch.initial_seed() + rank) % 2**63)
        try:
            yield
        finally:
            self.state = _global_state()
            _set_global_state(outside)

    def current(self) -> dict[str, Tensor]:
        """The state the next iteration starts from."""
        return self.state if self.state is not None else _global_state()


def gather_rng_states(stream: IterationRNG, generators: dict[str, torch.Generator]) -> list[dict[str, Tensor]]:
    """Every rank's random state (``stream`` and ``generators``), in rank order. Collective."""
    mine = {**stream.current(), **{name: g.get_state() for name, g in generators.items()}}
    if not dist_ready():
        return [mine]
    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, mine)
    return states


def restore_rng_states(states: list[dict[str, Tensor]] | dict[str, Tensor], stream: IterationRNG, generators: dict[str, torch.Generator]) -> None:
    """Set this rank's ``stream`` and ``generators`` from ``gather_rng_states`` output (warns when the world size changed)."""
    if isinstance(states, dict):  # checkpoints written before per-rank states: one state for all ranks
        states = [states]
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist_ready() else (0, 1)
    if len(states) != world:
        warnings.warn(f"the checkpoint holds random states of {len(states)} rank(s), this run has {world}: sampling continues, but not as the original run would have")
    state = states[rank % len(states)]
    stream.state = {k: v for k, v in state.items() if k in ("torch", "cuda")}
    for name, g in generators.items():
        if name in state:
            g.set_state(state[name])
