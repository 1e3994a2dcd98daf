"""FSDP2 over the models of an `RLModule` (the strategy itself: `lightning_rl.distributed.FSDP2Strategy`)."""

from __future__ import annotations

from torch import nn

from components.reward.model import scalar_head
from lightning_rl.distributed import FSDP2Strategy, fsdp_mesh, shard


def shard_models(module, strategy=None) -> None:
    """Shard the policy, the critic, the reference and reward models of an ``RLModule`` over its device mesh (idempotent)."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(module.policy, FSDPModule):
        return
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
            # it calls the backbone and the scalar head itself, not the classifier's forward: the backbone is the
            # unit to shard (its root hooks gather the embeddings); the one-row head stays replicated
            backbone, _ = scalar_head(reward.model)
            shard(backbone, mesh)
