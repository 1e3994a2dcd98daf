"""lightning_rl: reinforcement learning for language models on PyTorch Lightning, composed from components."""

from lightning_rl.core.batch import RolloutBatch, terminal_rewards
from lightning_rl.core.models import ModelSpec

__all__ = ["RolloutBatch", "terminal_rewards", "RLModule", "PromptDataModule", "ModelSpec", "Trainer", "fit"]


def __getattr__(name: str):
    # the engine imports the components, which import lightning_rl.core.batch: load the engine lazily
    if name == "RLModule":
        from lightning_rl.loop.module import RLModule

        return RLModule
    if name == "PromptDataModule":
        from lightning_rl.data.prompts import PromptDataModule

        return PromptDataModule
    if name in ("Trainer", "fit"):  # the Trainer `lightning-rl fit` builds, for Python (lightning_rl.trainer)
        from lightning_rl import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'lightning_rl' has no attribute {name!r}")
