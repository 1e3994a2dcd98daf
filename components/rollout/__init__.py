from lightning_rl.core.deprecation import moved

from .base import response_mask_from_eos
from .endpoint import OpenAIAgent, VerifiersAgent
from .hf import HFRollout
from .multi_turn import MultiTurnRollout
from .sglang import SGLangRollout
from .vllm import VLLMRollout

__all__ = [
    "HFRollout",
    "SGLangRollout",
    "VLLMRollout",
    "MultiTurnRollout",
    "OpenAIAgent",
    "VerifiersAgent",
    "response_mask_from_eos",
]


__getattr__ = moved(__name__, "lightning_rl.core.contracts", ("Agent", "Rollout"))
