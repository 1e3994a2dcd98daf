"""Components that misbehave on purpose, for the fault tests (importable by dotted path from a config)."""

from __future__ import annotations

from components.surrogate import ClippedSurrogate


class NaNSurrogate(ClippedSurrogate):
    """ClippedSurrogate whose loss is NaN on the calls listed in ``nan_calls`` (1-based), as after a blown-up update."""

    def __init__(self, nan_calls: list[int], eps_low: float = 0.2, eps_high: float = 0.2):
        super().__init__(eps_low=eps_low, eps_high=eps_high)
        self.nan_calls, self.calls = set(nan_calls), 0

    def per_token_loss(self, logprobs, batch):
        self.calls += 1
        loss, metrics = super().per_token_loss(logprobs, batch)
        return (loss * float("nan") if self.calls in self.nan_calls else loss), metrics
