"""What a round of OpenAIAgent episodes came to: its metrics (``agent/*``) and, when episodes failed, one console line
with their count and the first error (a failure such as a 400 for a full row is otherwise visible only as a metric)."""

from __future__ import annotations

import sys

import torch
from torch import Tensor

from .rounds import EpisodeRun


def round_metrics(episodes: list[EpisodeRun]) -> dict[str, Tensor]:
    n = max(1, len(episodes))

    def frac(status: str) -> Tensor:
        return torch.tensor(sum(e.status == status for e in episodes) / n)

    rows = [row.episode for e in episodes for row in e.conversation.rows]
    return {
        "agent/turns_mean": torch.tensor(sum(e.conversation.calls for e in episodes) / n),
        "agent/tool_calls_mean": torch.tensor(sum(e.tool_calls for e in episodes) / n),
        "agent/observation_tokens_mean": torch.tensor(sum(len(r.action) - sum(r.action) for r in rows) / n),
        "agent/prefix_breaks": torch.tensor(float(sum(e.conversation.prefix_breaks for e in episodes))),
        "agent/error_frac": frac("error"),
        "agent/timeout_frac": frac("timeout") + frac("cancelled"),
        "agent/no_call_frac": torch.tensor(sum(e.conversation.calls == 0 for e in episodes) / n),
        "agent/call_limit_frac": torch.tensor(sum("calls" in e.limits_hit for e in episodes) / n),
        "agent/row_limit_frac": torch.tensor(sum("rows" in e.limits_hit for e in episodes) / n),
    }


def report_failures(episodes: list[EpisodeRun]) -> None:
    """One console line for a round where episodes failed (their count and the first error), besides the metrics."""
    failed = [e for e in episodes if e.status in ("error", "timeout")]
    if failed:
        kinds = ", ".join(
            f"{sum(e.status == s for e in failed)} {s}"
            for s in ("error", "timeout")
            if any(e.status == s for e in failed)
        )
        first = failed[0].error.splitlines()[0] if failed[0].error else ""
        print(
            f"agents: {len(failed)} of {len(episodes)} episodes failed ({kinds}); the first: {first[:500]}",
            file=sys.stderr,
            flush=True,
        )
