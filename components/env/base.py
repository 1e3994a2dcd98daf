"""Moved: the environment contract (`Environment`, `Turn`, `Step`, `checked_step`) is in
`lightning_rl.core.contracts.environment`."""

from lightning_rl.core.deprecation import moved

__getattr__ = moved(
    __name__, "lightning_rl.core.contracts.environment", ("Environment", "Step", "Turn", "checked_step")
)
