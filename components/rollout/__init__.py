from .agent import Agent
from .base import Rollout, response_mask_from_eos
from .endpoint import OpenAIAgent, VerifiersAgent
from .hf import HFRollout
from .multi_turn import MultiTurnRollout
from .sglang import SGLangRollout
from .vllm import VLLMRollout

__all__ = [
    "Agent",
    "Rollout",
    "HFRollout",
    "SGLangRollout",
    "VLLMRollout",
    "MultiTurnRollout",
    "OpenAIAgent",
    "VerifiersAgent",
    "response_mask_from_eos",
]
