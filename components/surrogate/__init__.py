from .base import OffPolicyCorrection, Surrogate
from .clipped import ClippedSurrogate

__all__ = ["Surrogate", "OffPolicyCorrection", "ClippedSurrogate"]
