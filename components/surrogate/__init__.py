from .base import OffPolicyCorrection, Surrogate
from .cispo import CISPO
from .clipped import ClippedSurrogate
from .covariance import CovariancePG
from .decoupled import DecoupledClip
from .dro import DRO
from .importance_sampling import ImportanceSampling
from .policy_gradient import PolicyGradient
from .stable_reinforce import StableReinforce

__all__ = [
    "Surrogate",
    "OffPolicyCorrection",
    "ClippedSurrogate",
    "CISPO",
    "PolicyGradient",
    "CovariancePG",
    "DecoupledClip",
    "ImportanceSampling",
    "DRO",
    "StableReinforce",
]
