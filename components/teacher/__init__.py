"""Teachers for on-policy distillation: they score the tokens the student sampled."""

from lightning_rl.core.deprecation import moved

from .base import tokenizer_mismatch
from .hf import TINY_TEACHER_PATH, HFTeacher
from .server import CompletionsTeacher, ServerTeacher, SGLangTeacher, VLLMTeacher  # noqa: F401 (ServerTeacher: their base, no component itself)

__all__ = [
    "tokenizer_mismatch",
    "HFTeacher",
    "TINY_TEACHER_PATH",
    "SGLangTeacher",
    "VLLMTeacher",
    "CompletionsTeacher",
]


__getattr__ = moved(__name__, "lightning_rl.core.contracts.teacher", ("Teacher", "TeacherScores"))
