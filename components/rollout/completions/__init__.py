"""Any OpenAI-compatible ``/v1/completions`` server as a scoring engine (a teacher's; it samples no rollout)."""

from .engine import CompletionsEngine, CompletionsError

__all__ = ["CompletionsEngine", "CompletionsError"]
