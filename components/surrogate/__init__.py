from lightning_rl.core.deprecation import moved

from .base import OffPolicyCorrection
from .cispo import CISPO
from .clipped import ClippedSurrogate
from .covariance import CovariancePG
from .decoupled import DecoupledClip
from .dro import DRO
from .importance_sampling import ImportanceSampling
from .policy_gradient import PolicyGradient
from .stable_reinforce import StableReinforce

__all__ = [
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


__getattr__ = moved(__name__, "lightning_rl.core.contracts.surrogate", ("Surrogate",))
