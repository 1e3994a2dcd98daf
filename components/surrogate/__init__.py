from .base import OffPolicyCorrection, Surrogate
from .cispo import CISPO
from .clipped import ClippedSurrogate
from .covariance import CovariancePG
from .decoupled import DecoupledClip
from .policy_gradient import PolicyGradient

__all__ = [
    "Surrogate",
    "OffPolicyCorrection",
    "ClippedSurrogate",
    "CISPO",
    "PolicyGradient",
    "CovariancePG",
    "DecoupledClip",
]
