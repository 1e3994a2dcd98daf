"""An OpenAI-compatible endpoint served by the trainer during rollout, and the agent component that runs your function on it."""

from components.env.tool_calls import HermesToolCalls, JsonToolCalls, TagToolCalls, ToolCallParser

from .agent import OpenAIAgent, RoundInterrupted
from .server import EndpointLimits

__all__ = [
    "OpenAIAgent",
    "EndpointLimits",
    "RoundInterrupted",
    "ToolCallParser",
    "HermesToolCalls",
    "JsonToolCalls",
    "TagToolCalls",
]
from .verifiers_env import VerifiersAgent  # noqa: E402

__all__ += ["VerifiersAgent"]
