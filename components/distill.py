"""`TeacherKL`: on-policy distillation as a loss term, the reverse KL from the policy to a teacher on the policy's
own samples (GKD, Agarwal et al. 2024, arXiv:2306.13649, with the reverse KL, beta = 1; Thinking Machines, "On-Policy
Distillation", 2025). The teacher's scores are on the batch (``model.teacher``); the same signal as a per-token
advantage or reward is `components.advantage.DistillAdvantage`.

Three estimates of KL(pi_theta || pi_T) at each sampled position t:

* ``sampled``: k2 = 1/2 (log pi_theta(y_t) - log pi_T(y_t))^2 on the sampled token (components.kl, never clamped:
  a token the teacher rejects hardest, log pi_T = -25, keeps its full gradient). Its gradient,
  (log pi_theta - log pi_T) grad log pi_theta, is a single-sample estimate of the per-token reverse KL's gradient
  on-policy (the seeds' section 9); its value is not the KL (``distill/reverse_kl`` reports k1, whose mean is).
* ``exact``: sum_v pi_theta(v) (log pi_theta(v) - log pi_T(v)) over the whole vocabulary, differentiated exactly
  (lightning_rl.core.divergence). Needs the teacher's full distribution: a teacher in this process.
* ``topk``: the same over the teacher's k most likely tokens plus one bucket for the rest of each distribution (a
  lower bound of the exact KL, equal to it when k covers the vocabulary). Any teacher that returns its top k.

Departures: each term is per token (the reverse KL's effect on later tokens is left out, as for every per-token KL
loss); with several epochs the samples come from pi_old and no importance weight corrects the term.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from components.kl import kl_estimate
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import LossTerm
from lightning_rl.core.divergence import exact_reverse_kl, topk_reverse_kl
from lightning_rl.core.forward_outputs import PolicyForward

Variant = Literal["sampled", "exact", "topk"]
READS = {
    "sampled": frozenset({"teacher_logprobs"}),
    "exact": frozenset({"teacher_logits"}),
    "topk": frozenset({"teacher_topk_ids", "teacher_topk_logprobs"}),
}


class TeacherKL(LossTerm):
    """coef * KL(pi_theta || pi_T) at each response token: the reverse KL to a teacher on the policy's own samples
    (on-policy distillation, GKD, Agarwal et al. 2024, arXiv:2306.13649), sampled, exact or over the teacher's top k."""

    def __init__(self, coef: float = 1.0, variant: Variant = "exact", chunk_rows: int | None = None):
        """
        Args:
            coef: the term's weight.
            variant: sampled (the sampled token's k2), exact (full vocabulary; a teacher in this process) or topk
                (the teacher's top k and the rest: set model.teacher.init_args.top_k).
            chunk_rows: positions per fp32 chunk of the full-vocabulary computation (None: ~16 MB chunks).
        """
        if variant not in READS:
            raise ValueError(f"TeacherKL: variant must be sampled, exact or topk, got {variant!r}")
        if coef < 0:
            raise ValueError(f"TeacherKL: coef must be >= 0, got {coef}")
        self.coef, self.variant, self.chunk_rows = coef, variant, chunk_rows
        self.requires = READS[variant]
        self.reads = frozenset() if variant == "sampled" else frozenset({"logits"})

    def __call__(self, forward: PolicyForward, batch: RolloutBatch) -> Tensor:
        """Shape: (B, R)."""
        if self.variant == "sampled":
            return self.coef * kl_estimate(forward.logprobs, batch.teacher_logprobs, "k2")
        logits = forward.logits
        if logits is None:
            raise ValueError(
                f"TeacherKL ({self.variant}) reads the policy's logits: give it a PolicyForward with logits"
            )
        if self.variant == "exact":
            kl = exact_reverse_kl(
                logits.logits, logits.align(batch.teacher_logits), logits.temperature, self.chunk_rows
            )
        else:
            ids, teacher = logits.align(batch.teacher_topk_ids), logits.align(batch.teacher_topk_logprobs)
            kl = topk_reverse_kl(logits.logits, ids, teacher, logits.temperature, self.chunk_rows)
        return self.coef * logits.scatter(kl)
