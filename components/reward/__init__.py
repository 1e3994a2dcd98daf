from lightning_rl.core.deprecation import moved

from .composite import Composite
from .eos import MissingEOSPenalty
from .format import Format
from .function import FunctionReward
from .match import ExactMatch
from .overlong import OverlongPenalty
from .pooled import PooledReward
from .reasoning_gym import ReasoningGymScore
from .result import ResultScore
from .verifier import MathVerify

__all__ = [
    "FunctionReward",
    "ExactMatch",
    "Composite",
    "Format",
    "MathVerify",
    "MissingEOSPenalty",
    "OverlongPenalty",
    "PooledReward",
    "ReasoningGymScore",
    "ResultScore",
]
from .model import RewardModel  # noqa: E402
from .shaping import Shaped  # noqa: E402

__all__ += ["RewardModel", "Shaped"]


__getattr__ = moved(__name__, "lightning_rl.core.contracts.reward", ("Reward", "RewardInputs", "as_scores"))
