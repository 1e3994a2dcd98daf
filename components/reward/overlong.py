"""`OverlongPenalty`: DAPO's soft overlong punishment, a length-aware reward term."""

from __future__ import annotations

from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Reward


class OverlongPenalty(Reward):
    """Soft overlong punishment (Yu et al. 2025, DAPO, arXiv:2503.14476, eq. 13), with L = response tokens:

        R = 0                                          L <= L_max - L_cache
        R = penalty * ((L_max - L_cache) - L) / L_cache  L_max - L_cache < L <= L_max
        R = -penalty                                   L > L_max

    a ramp from 0 to -penalty over the last ``buffer`` (L_cache) tokens before ``max_length``
    (L_max, the rollout's ``max_new_tokens``). Add it to the task reward with `Composite`.
    L counts the sampled tokens including the EOS (the response mask).
    """

    requires = frozenset({"response_mask"})

    def __init__(self, max_length: int, buffer: int, penalty: float = 1.0):
        """
        Args:
            max_length: L_max, the length at which the full penalty applies (the rollout's max_new_tokens).
            buffer: L_cache, the number of tokens before ``max_length`` over which the penalty ramps up.
            penalty: the penalty at ``max_length`` (DAPO: 1.0).
        """
        if not 0 < buffer <= max_length:
            raise ValueError(
                f"OverlongPenalty: need 0 < buffer <= max_length, got buffer={buffer}, max_length={max_length}"
            )
        self.max_length, self.buffer, self.penalty = max_length, buffer, penalty

    def __call__(self, batch: RolloutBatch) -> Tensor:
        lengths = batch.response_lengths.float()  # (B,)
        start = self.max_length - self.buffer
        ramp = (lengths - start).clamp(0.0, float(self.buffer)) / self.buffer  # (B,) 0 -> 1 over the buffer
        return -self.penalty * ramp
