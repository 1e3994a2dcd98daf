"""The teacher contract: ``score(batch) -> TeacherScores``, the teacher's log-probs of the tokens the student sampled.

On-policy distillation (Agarwal et al. 2024, GKD, arXiv:2306.13649; Thinking Machines, "On-Policy Distillation", 2025)
trains the student on its own samples, scored token by token by a teacher: teacher forcing on the student's response.
The call is the same whatever runs the teacher: a transformers model in this process (`HFTeacher`), or a server that
scores given tokens (a prompt-log-prob request) and returns the same fields. Only a teacher in this process gives its
whole distribution (``logits``), which the exact full-vocabulary reverse KL needs; any teacher can give its top-k.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

from torch import Tensor, nn

from lightning_rl.core.batch import RolloutBatch


class TeacherScores(NamedTuple):
    """What a teacher returns; the names are the `RolloutBatch` fields the trainer forward writes."""

    teacher_logprobs: Tensor  # (B, R) fp32: log p_teacher(y_t | x, y_<t) of each sampled token
    teacher_topk_ids: Tensor | None = None  # (B, R, K) long: the teacher's K most likely tokens at each position
    teacher_topk_logprobs: Tensor | None = None  # (B, R, K) fp32: their log-probs, largest first


class Teacher(ABC):
    """Scores the student's sampled tokens. Never trains; checkpoints leave it out and it is built again from its path."""

    requires: frozenset[str] = frozenset({"prompt_ids", "prompt_mask"})
    top_k: int = 0
    full_distribution: bool = False
    """Whether `logits` gives the teacher's whole distribution (a model in this process)."""

    @property
    def provides(self) -> frozenset[str]:
        """The `RolloutBatch` fields this teacher fills: ``teacher_logprobs``, with ``top_k`` the top-k fields, and
        ``teacher_logits`` (per micro-batch, during the update) when it has its whole distribution."""
        fields = {"teacher_logprobs"}
        if self.top_k:
            fields |= {"teacher_topk_ids", "teacher_topk_logprobs"}
        if self.full_distribution:
            fields.add("teacher_logits")
        return frozenset(fields)

    @property
    def shard_unit(self) -> nn.Module | None:
        """The model FSDP2 shards with the others (None: a teacher on its own device or behind a server)."""
        return None

    def describe(self) -> str | None:
        """What ``--dry_run`` says of the teacher beside the policy's models (where it scores), or None."""
        return None

    def setup(self, tokenizer) -> None:
        """Called once the policy's tokenizer exists: refuse a teacher that reads its token ids otherwise, then load."""

    @abstractmethod
    def score(self, batch: RolloutBatch) -> TeacherScores:
        """The teacher's log-probs of ``batch.response_ids`` after ``batch.prompt_ids``. No gradient."""

    def close(self) -> None:
        """Release what scoring holds (a server teacher's connections, a server it launched)."""

    def logits(self, batch: RolloutBatch) -> Tensor:
        """The teacher's logits at each response position, already divided by its temperature, fp32. Shape: (B, R, V)."""
        raise NotImplementedError(
            f"{type(self).__name__} gives no full distribution: the exact reverse KL needs a teacher in this process "
            "(components.teacher.HFTeacher); use the top-k variant with this one"
        )
