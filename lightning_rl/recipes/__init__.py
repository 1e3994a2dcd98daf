"""Recipes beside RL on the same building blocks: supervised fine-tuning, reward-model training and the tiny-model builders."""

from __future__ import annotations

from typing import Any


def adamw_with_warmup(parameters, lr: float, weight_decay: float, warmup_steps: int) -> dict[str, Any]:
    """``configure_optimizers``' answer: AdamW over the trainable ``parameters``, its learning rate rising linearly over
    ``warmup_steps`` optimizer steps, then constant."""
    import torch

    optimizer = torch.optim.AdamW([p for p in parameters if p.requires_grad], lr=lr, weight_decay=weight_decay)
    warmup = max(1, warmup_steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
