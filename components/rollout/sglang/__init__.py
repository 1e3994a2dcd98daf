"""SGLang rollout: a client of SGLang's native HTTP API (SGLang runs in its own process and environment)."""

from .client import SGLangClient, SGLangError
from .rollout import SGLangRollout

__all__ = ["SGLangClient", "SGLangError", "SGLangRollout"]
