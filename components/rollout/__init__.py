from .agent import Agent
from .base import Rollout, response_mask_from_eos
from .endpoint import OpenAIAgent, VerifiersAgent
from .hf import HFRollout
from .multi_turn import MultiTurnRollout
from .sglang import SGLangRollout

__all__ = [
    "Agent",
    "Rollout",
    "HFRollout",
    "SGLangRollout",
    "MultiTurnRollout",
    "OpenAIAgent",
    "VerifiersAgent",
    "response_mask_from_eos",
]
