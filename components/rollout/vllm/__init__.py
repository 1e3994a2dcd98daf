"""vLLM rollout: a client of vLLM's HTTP API (vLLM runs in its own process and environment)."""

from .client import VLLMClient, VLLMError
from .rollout import VLLMRollout

__all__ = ["VLLMClient", "VLLMError", "VLLMRollout"]
