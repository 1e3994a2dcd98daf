"""An OpenAI-compatible endpoint served by the trainer during rollout, and the agent component that runs your function on it."""

from .agent import OpenAIAgent
from .tool_calls import HermesToolCalls, JsonToolCalls, TagToolCalls, ToolCallParser

__all__ = ["OpenAIAgent", "ToolCallParser", "HermesToolCalls", "JsonToolCalls", "TagToolCalls"]
from .verifiers_env import VerifiersAgent  # noqa: E402

__all__ += ["VerifiersAgent"]
