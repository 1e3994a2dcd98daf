"""Moved: the agent contract is `lightning_rl.core.contracts.Agent`."""

from lightning_rl.core.deprecation import moved

__getattr__ = moved(__name__, "lightning_rl.core.contracts.agent", ("Agent",))
