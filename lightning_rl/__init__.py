"""lightning_rl: reinforcement learning for language models on PyTorch Lightning, composed from components."""

from .batch import RolloutBatch, terminal_rewards
from .models import ModelSpec

__all__ = ["RolloutBatch", "terminal_rewards", "RLModule", "PromptDataModule", "ModelSpec"]


def __getattr__(name: str):
    # the engine imports the components, which import lightning_rl.batch: load the engine lazily
    if name == "RLModule":
        from .module import RLModule

        return RLModule
    if name == "PromptDataModule":
        from .data import PromptDataModule

        return PromptDataModule
    raise AttributeError(f"module 'lightning_rl' has no attribute {name!r}")
