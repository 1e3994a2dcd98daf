from .base import Rollout, response_mask_from_eos
from .hf import HFRollout

__all__ = ["Rollout", "HFRollout", "response_mask_from_eos"]
