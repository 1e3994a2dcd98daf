"""Prompt data for RL (`PromptDataModule`), the built-in tasks and preference pairs for reward-model training."""

from lightning_rl.data.prompts import PromptDataModule

__all__ = ["PromptDataModule"]
