from lightning_rl.core.deprecation import moved

from .distill import DistillAdvantage
from .gae import GAE
from .group import GroupNormalized
from .leave_one_out import LeaveOneOut
from .reinforce import ReinforceBaseline
from .reinforce_pp import ReinforcePlusPlus, reward_to_go
from .remax import ReMax

__all__ = [
    "DistillAdvantage",
    "GAE",
    "GroupNormalized",
    "LeaveOneOut",
    "ReinforceBaseline",
    "ReinforcePlusPlus",
    "ReMax",
    "reward_to_go",
]


__getattr__ = moved(__name__, "lightning_rl.core.contracts.advantage", ("AdvantageEstimator", "Advantages"))
