"""Training health: non-finite updates skipped (and never saved), and a run that stopped learning said so once.

- `TrainingHealth.finite_step` decides, the same on every rank, whether an optimizer step may run: a
  NaN/inf loss or gradient norm skips it (``health/skipped_nonfinite`` counts them), and
  ``loop.max_nonfinite_steps`` skips in a row stop the run with the likely causes.
- `TrainingHealth.observe` watches the iteration metrics: every group degenerate (all of a group's
  samples scored alike, so group-relative advantages are zero) for ``loop.degenerate_patience``
  iterations in a row, or the policy's mean token entropy under ``loop.min_entropy``, is warned about
  once, with what to try.
- `lightning_rl.callbacks.FiniteCheckpoints` refuses to write a checkpoint whose weights hold NaN/inf, so the previous
  ``last.ckpt`` survives a diverged run.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from lightning_rl.core.errors import NonFiniteTrainingError
from lightning_rl.core.ops import all_reduce_sum


class TrainingHealth:
    """Per-run counters behind the checks above (host ints and flags; the module owns one)."""

    def __init__(self, max_nonfinite_steps: int, degenerate_patience: int, min_entropy: float):
        self.max_nonfinite_steps, self.degenerate_patience, self.min_entropy = (
            max_nonfinite_steps,
            degenerate_patience,
            min_entropy,
        )
        self.nonfinite_streak = 0
        self.degenerate_streak = 0
        self.warned: set[str] = set()

    def finite_step(self, values: list[Tensor], lr: float) -> bool:
        """True when every value (losses, gradient norms) is finite on every rank; else the step is to be skipped.

        Raises after ``max_nonfinite_steps`` skipped steps in a row."""
        flags = torch.stack([(~torch.isfinite(v.detach().float())).any() for v in values]).any().float()
        if float(all_reduce_sum(flags)) == 0:  # one host sync per optimizer step: the decision is control flow
            self.nonfinite_streak = 0
            return True
        self.nonfinite_streak += 1
        if self.max_nonfinite_steps and self.nonfinite_streak >= self.max_nonfinite_steps:
            raise NonFiniteTrainingError(
                f"{self.nonfinite_streak} optimizer steps in a row had a NaN/inf loss or gradient norm and were skipped "
                f"(loop.max_nonfinite_steps={self.max_nonfinite_steps}). Likely causes: a learning rate too high for this model "
                f"(model.optimizer.lr={lr:g}: try 10x lower, or warmup_steps), rewards on a large scale (rescale the reward, or "
                "normalise advantages), or no gradient clipping (model.optimizer.max_grad_norm). The checkpoints hold only finite weights."
            )
        warnings.warn(f"non-finite loss or gradient norm: optimizer step skipped ({self.nonfinite_streak} in a row)")
        return False

    def observe(self, metrics: dict[str, float], iteration: int) -> None:
        """Warn once when the run stopped learning (every group degenerate for a while, or collapsed entropy)."""
        degenerate = metrics.get("sampling/zero_var_groups")
        if degenerate is not None and self.degenerate_patience:
            self.degenerate_streak = self.degenerate_streak + 1 if degenerate >= 1.0 else 0
            if self.degenerate_streak >= self.degenerate_patience:
                self._once(
                    "degenerate",
                    f"iteration {iteration}: every group has been degenerate (all of its samples scored the same) for "
                    f"{self.degenerate_streak} iterations in a row, so the policy gets no learning signal. If the reward "
                    "was moving before, the policy has likely diverged (lower model.optimizer.lr, resume from an earlier "
                    "checkpoint); otherwise the task is too hard or too easy for it: raise model.rollout.group_size or "
                    "the sampling temperature, use a denser reward, or filter groups with model.sampling (DynamicSampling).",
                )
        entropy = metrics.get("policy/entropy")
        if entropy is not None and self.min_entropy and entropy < self.min_entropy:
            self._once(
                "entropy",
                f"iteration {iteration}: the policy's mean token entropy fell to {entropy:.2g} (< loop.min_entropy={self.min_entropy:g}): "
                "it samples (almost) the same response every time and exploration has collapsed. Try a lower "
                "model.optimizer.lr, a KL penalty to the reference (model.kl), an entropy bonus (model.loss_terms: "
                "EntropyBonus), a higher eps_high (clip-higher), or resume from an earlier checkpoint.",
            )

    def _once(self, key: str, message: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            warnings.warn(message)
