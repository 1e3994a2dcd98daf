"""FSDP2 over the models of an `RLModule` (the strategy itself: `lightning_rl.distributed.FSDP2Strategy`)."""

from __future__ import annotations

from lightning_rl.distributed import FSDP2Strategy, fsdp_mesh, shard
from lightning_rl.roster import ROSTER


def shard_models(module, strategy=None) -> None:
    """Shard every unit the roster's slots name over the module's device mesh, in roster order (idempotent)."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(module.policy, FSDPModule):
        return
    if strategy is not None and not isinstance(strategy, FSDP2Strategy):
        raise ValueError(
            f"trainer.strategy is {type(strategy).__name__}: for FSDP2 use lightning_rl.distributed.FSDP2Strategy "
            "(configs/strategy/fsdp.yaml), whose checkpoints leave out the frozen models and reload them"
        )
    mesh = fsdp_mesh(module.device_mesh)
    sharded: set[int] = set()
    for slot in ROSTER:
        for model, blocks_of in slot.shard(module):
            if id(model) not in sharded:  # one model in two slots (a reward that also validates) is sharded once
                sharded.add(id(model))
                shard(model, mesh, blocks_of=blocks_of)
    # HFRollout (and transformers' generate, as synced_gpus) keeps ranks stepping together for modules with this flag
    module.policy._is_fsdp_managed_module = True
