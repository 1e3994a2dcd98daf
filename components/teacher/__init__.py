"""Teachers for on-policy distillation: they score the tokens the student sampled."""

from .base import Teacher, TeacherScores, tokenizer_mismatch
from .hf import TINY_TEACHER_PATH, HFTeacher
from .server import CompletionsTeacher, ServerTeacher, SGLangTeacher, VLLMTeacher  # noqa: F401 (ServerTeacher: their base, no component itself)

__all__ = [
    "Teacher",
    "TeacherScores",
    "tokenizer_mismatch",
    "HFTeacher",
    "TINY_TEACHER_PATH",
    "SGLangTeacher",
    "VLLMTeacher",
    "CompletionsTeacher",
]
