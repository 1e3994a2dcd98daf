from .base import Reward, RewardInputs, as_scores
from .function import FunctionReward
from .match import ExactMatch

__all__ = ["Reward", "RewardInputs", "as_scores", "FunctionReward", "ExactMatch"]
