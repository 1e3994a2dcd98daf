from .base import Advantages, AdvantageEstimator
from .group import GroupNormalized

__all__ = ["Advantages", "AdvantageEstimator", "GroupNormalized"]
