"""Plumbing for data-parallel and sharded training: FSDP2 sharding and its strategy, DDP and DeepSpeed details.

Every strategy trains the same way: each rank holds different prompts (a group never spans
ranks), losses are normalised by all-reduced token counts, and gradients are averaged over
ranks by the strategy (DDP all-reduce, FSDP2 reduce-scatter, DeepSpeed ZeRO).

* FSDP2 (``FSDP2Strategy``, configs/strategy/fsdp.yaml): ``RLModule.configure_model`` calls
  ``shard_models`` (lightning_rl.loop.sharding), which applies ``fully_shard`` to every transformer block (the HF model's
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

import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import Tensor, nn

from lightning_rl.checkpoint import frozen_parameter_names, replace_path

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
        self._data_parallel_size, self._tensor_parallel_size = (
            (1, world) if self.sharding == "all" else (self.num_nodes, self.num_processes)
        )
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

        frozen = frozen_parameter_names(self.model)
        state = get_model_state_dict(
            self.model, options=StateDictOptions(cpu_offload=cpu_offload, ignore_frozen_params=True)
        )
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
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        path = Path(self.broadcast(str(checkpoint_path)))
        if not (path / _METADATA_FILENAME).is_file():
            raise FileNotFoundError(
                f"{path} is not a checkpoint folder written by FSDP2Strategy (no {_METADATA_FILENAME} in it)"
            )
        # only the trainable state is in the checkpoint; frozen models keep the weights loaded from their paths
        state = {"state_dict": self._trainable_state()}
        dcp.load(state, checkpoint_id=path)
        set_model_state_dict(self.model, state["state_dict"], options=StateDictOptions(strict=False))
        for i, optimizer in enumerate(self.optimizers):
            optim_state = {f"optimizer_{i}": get_optimizer_state_dict(self.model, optimizer)}
            dcp.load(optim_state, checkpoint_id=path)
            set_optimizer_state_dict(
                self.model,
                optimizer,
                optim_state_dict=optim_state[f"optimizer_{i}"],
                options=StateDictOptions(cpu_offload=True),
            )
        return torch.load(path / _METADATA_FILENAME, weights_only=weights_only)


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
    frozen = frozen_parameter_names(module)
    if any(type(p).__name__ == "DTensor" for p in module.parameters()):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        state = get_model_state_dict(module, options=options)
        return {
            k: v for k, v in state.items() if k not in frozen
        }  # tied aliases of frozen weights survive ignore_frozen_params
    if uses_deepspeed(trainer) and getattr(trainer.strategy, "zero_stage_3", False):
        import deepspeed

        params = [p for name, p in module.named_parameters() if name in trainable]
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return _cpu_copy(module.state_dict(), frozen) if trainer.is_global_zero else {}
    return _cpu_copy(module.state_dict(), frozen) if trainer is None or trainer.is_global_zero else {}


def _cpu_copy(state: dict[str, Tensor], skip: set[str]) -> dict[str, Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items() if k not in skip}
