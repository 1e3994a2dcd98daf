"""Moved: the reward contract and its helpers are in `lightning_rl.core.contracts.reward`."""

from lightning_rl.core.deprecation import moved

__getattr__ = moved(
    __name__,
    "lightning_rl.core.contracts.reward",
    (
        "Reward",
        "RewardInputs",
        "ROLLOUT_COLUMNS",
        "OnFailure",
        "Scores",
        "columns",
        "column",
        "NotAScore",
        "failure_line",
        "as_scores",
    ),
)
