from .base import Rollout, response_mask_from_eos
from .hf import HFRollout
from .sglang import SGLangRollout

__all__ = ["Rollout", "HFRollout", "SGLangRollout", "response_mask_from_eos"]
