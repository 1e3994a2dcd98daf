"""The server layer: a rollout sampling on inference servers over HTTP (`ServerRollout`) and the small protocol an
engine implements (`Engine`); SGLang and vLLM are two such engines."""

from .engine import Engine
from .http import HTTPClient, ServerError
from .rollout import ServerRollout

__all__ = ["Engine", "HTTPClient", "ServerError", "ServerRollout"]
