from .base import Rollout, response_mask_from_eos
from .hf import HFRollout
from .multi_turn import MultiTurnRollout
from .sglang import SGLangRollout

__all__ = ["Rollout", "HFRollout", "SGLangRollout", "MultiTurnRollout", "response_mask_from_eos"]
