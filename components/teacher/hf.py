"""`HFTeacher`: a transformers causal LM in this process scores the student's sampled tokens.

Any size or architecture, in its own precision (``dtype``) and optionally on its own device; it must read the
student's token ids as the same text (checked at setup: the tokenizers' vocabularies are compared). Its log-probs are
``log_softmax(logits / temperature)`` at each response position, over its whole vocabulary, fp32. The trainer forward
runs it on the same micro-batches as the reference; the exact reverse KL also calls `logits` on each micro-batch of
the update (one more no-grad forward per micro-batch; the full (b, r, V) logits are never stored for the whole batch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from torch import Tensor, nn

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Teacher, TeacherScores
from lightning_rl.core.errors import ConfigError
from lightning_rl.core.logprobs import response_logits, sampled_logprobs
from lightning_rl.core.models import ModelSpec, freeze, load_causal_lm, load_tokenizer

from .base import tokenizer_mismatch

TINY_TEACHER_PATH = str(Path(__file__).resolve().parents[2] / "lightning_rl" / "assets" / "tiny-arith-teacher")
"""The built-in task's teacher: a tiny Qwen2 trained on exact answers, in bfloat16 (scripts/make_tiny_teacher.py)."""

KEY = "model.teacher.init_args"


class HFTeacher(Teacher, nn.Module):
    """log p_teacher(y_t | x, y_<t) = log_softmax(z_t / T)[y_t] of a frozen causal LM, teacher-forced on the student's
    response (on-policy distillation, Agarwal et al. 2024, arXiv:2306.13649)."""

    full_distribution = True

    def __init__(
        self,
        path: str = TINY_TEACHER_PATH,
        dtype: Literal["float32", "bfloat16", "float16"] = "float32",
        device: str | None = None,
        temperature: float = 1.0,
        top_k: int = 0,
        trust_remote_code: bool = False,
        attn_implementation: str | None = None,
    ):
        """
        Args:
            path: a save_pretrained causal LM with the policy's tokenizer (local folder or hub id); the default is the
                built-in arithmetic task's teacher.
            dtype: the teacher's own parameter dtype (a frozen model can be bfloat16: 2 bytes per parameter).
            device: run the teacher there (e.g. ``cuda:1``) and keep it out of the strategy's reach (not moved, wrapped
                or sharded); None = with the policy (moved and, under FSDP2, sharded like the reference).
            temperature: the teacher's distribution is softmax(logits / temperature).
            top_k: also return the teacher's k most likely tokens at each position (the top-k reverse KL); 0 = none.
            trust_remote_code: passed to transformers when loading.
            attn_implementation: e.g. ``sdpa`` or ``eager``; None lets transformers choose.
        """
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"HFTeacher: temperature must be > 0, got {temperature}")
        if top_k < 0:
            raise ValueError(f"HFTeacher: top_k must be >= 0, got {top_k}")
        self.path, self.dtype, self.device_name, self.temperature, self.top_k = path, dtype, device, temperature, top_k
        self.trust_remote_code, self.attn_implementation = trust_remote_code, attn_implementation
        self.model: nn.Module | None = None

    def setup(self, tokenizer) -> None:
        """Compare the tokenizers, then load the frozen model once (the module calls this in ``configure_model``)."""
        if self.model is not None:
            return
        reason = tokenizer_mismatch(tokenizer, load_tokenizer(self.path, f"{KEY}.path"))
        if reason is not None:
            raise ConfigError(
                f"{KEY}.path: the teacher's tokenizer ({self.path}) differs from the policy's: {reason}. The teacher "
                "scores the policy's token ids as they are: use a teacher trained with the policy's tokenizer"
            )
        spec = ModelSpec(
            path=self.path, dtype=self.dtype, trust_remote_code=self.trust_remote_code,
            attn_implementation=self.attn_implementation,
        )  # fmt: skip
        model = freeze(load_causal_lm(spec, "model.teacher"))
        if self.device_name is None:
            self.model = model  # a submodule: moved with the policy, sharded by FSDP2, left out of checkpoints
        else:  # outside the module tree: Lightning neither moves, wraps, shards nor saves it
            object.__setattr__(self, "model", model.to(self.device_name))

    @property
    def shard_unit(self) -> nn.Module | None:
        return self.model if self.device_name is None else None

    def describe(self) -> str | None:
        if self.model is None or self.device_name is None:  # in the module tree: counted with the policy's models
            return None
        return f"{sum(p.numel() for p in self.model.parameters()):,} parameters on {self.device_name}, outside the strategy"

    def train(self, mode: bool = True) -> "HFTeacher":
        """The teacher stays in eval mode."""
        self.training = mode
        return self

    def _inputs(self, batch: RolloutBatch) -> RolloutBatch:
        if self.model is None:
            raise RuntimeError("HFTeacher.setup(tokenizer) must run before scoring (RLModule.configure_model does it)")
        batch.require(self.requires, "HFTeacher")
        slim = RolloutBatch(batch.response_ids, batch.response_mask, batch.prompt_ids, batch.prompt_mask)
        return slim.to(next(self.model.parameters()).device)

    @torch.no_grad()
    def logits(self, batch: RolloutBatch) -> Tensor:
        inputs = self._inputs(batch)
        z = response_logits(
            self.model, inputs.prompt_ids, inputs.prompt_mask, inputs.response_ids, inputs.response_mask
        )
        return (z.float() / self.temperature).to(batch.response_ids.device)  # (B, R, V)

    @torch.no_grad()
    def score(self, batch: RolloutBatch) -> TeacherScores:
        inputs = self._inputs(batch)
        z = response_logits(
            self.model, inputs.prompt_ids, inputs.prompt_mask, inputs.response_ids, inputs.response_mask
        )
        device = batch.response_ids.device
        logprobs = sampled_logprobs(z, inputs.response_ids, self.temperature).to(device)  # (B, R)
        if not self.top_k:
            return TeacherScores(logprobs)
        values, ids = (z.float() / self.temperature).topk(self.top_k, dim=-1)  # (B, R, K)
        lse = torch.logsumexp(z.float() / self.temperature, dim=-1, keepdim=True)  # (B, R, 1)
        return TeacherScores(logprobs, ids.to(device), (values - lse).to(device))
