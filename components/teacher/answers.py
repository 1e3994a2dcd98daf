"""Whether a teacher server's answer is one a model can give, checked before any of it reaches the loss.

A model's log-probs are log_softmax(z): finite for the given tokens and at most 0, each top-k list k distinct ids of
the vocabulary whose probabilities sum to at most 1. A server that answers otherwise (NaN, which SGLang writes as
JSON null, +inf, a positive log-prob, an id twice, an id past the vocabulary) is broken or serves something else, and
its numbers would go into the KL as they are: a duplicated id counts its mass twice, a NaN spreads through the batch,
an id past the vocabulary fails deep in the loss without naming the server. Every answer is checked; the first wrong
value fails naming the server.
"""

from __future__ import annotations

import torch

from components.rollout.server.http import ServerError
from components.rollout.server.samples import Scored

TOLERANCE = 1e-3
"""Rounding a server may add: a log-prob up to this above 0, top-k probabilities summing up to 1 + this."""


def scored_problem(scored: Scored, n: int, top_k: int, vocabulary: int | None) -> str | None:
    """What in ``scored`` no model gives, for ``n`` given tokens, ``top_k`` top ids each (0: none asked) and a
    vocabulary of ids 0..vocabulary - 1 (None: not checked); None when it is an answer a model can give."""
    if len(scored.logprobs) != n:
        return f"{len(scored.logprobs)} log-probs for {n} given tokens"
    given = torch.tensor(scored.logprobs, dtype=torch.float64)  # (R,)
    wrong = (~given.isfinite() | (given > TOLERANCE)).nonzero()
    if len(wrong):
        t = int(wrong[0, 0])
        return f"log-prob {_show(scored.logprobs[t])} for the given token at position {t}"
    if not top_k or not n:
        return None
    ids, values = scored.top_ids or [], scored.top_logprobs or []
    if len(ids) != n or len(values) != n:
        return f"{len(ids)} top-k id lists and {len(values)} top-k log-prob lists for {n} given tokens"
    for t, (row, row_values) in enumerate(zip(ids, values)):
        if len(row) != top_k or len(row_values) != top_k:
            return f"{len(row)} top ids and {len(row_values)} log-probs at position {t} for top_k={top_k}"
    top = torch.tensor(ids, dtype=torch.long)  # (R, K)
    if vocabulary is not None:
        outside = ((top < 0) | (top >= vocabulary)).nonzero()
        if len(outside):
            t, j = (int(x) for x in outside[0])
            return f"top-k token id {ids[t][j]} at position {t}, outside the policy's vocabulary (0..{vocabulary - 1})"
    ranked = top.sort(-1).values  # (R, K)
    twice = (ranked[:, 1:] == ranked[:, :-1]).nonzero()  # (., 2): position, index of the pair
    if len(twice):
        t, j = (int(x) for x in twice[0])
        return f"token id {int(ranked[t, j])} twice in the top {top_k} at position {t} ({ids[t]})"
    logprobs = torch.tensor(values, dtype=torch.float64)  # (R, K)
    wrong = (logprobs.isnan() | (logprobs > TOLERANCE)).any(-1).nonzero()
    if len(wrong):
        t = int(wrong[0, 0])
        return f"top-{top_k} log-probs {_show(values[t])} at position {t} (NaN, +inf or above 0)"
    mass = logprobs.exp().sum(-1)  # (R,)
    past = (mass > 1 + TOLERANCE).nonzero()
    if len(past):
        t = int(past[0, 0])
        return (
            f"top-{top_k} log-probs {_show(values[t])} at position {t}, whose probabilities sum past 1 ({mass[t]:.3f})"
        )
    return None


def check_scored(
    error: type[ServerError], url: str, key: str, scored: Scored, n: int, top_k: int, vocabulary: int | None
) -> None:
    """Raise ``error`` naming the server at ``url`` and its setting ``key`` when `scored_problem` finds one."""
    problem = scored_problem(scored, n, top_k, vocabulary)
    if problem is not None:
        raise error(
            f"{error.engine} server at {url} ({key}) answered scores no teacher can give: {problem}. Its log-probs "
            "must be finite and at most 0, its top k distinct ids of the policy's vocabulary: check the model it "
            "serves and its version"
        )


def _show(value):
    """A log-prob (or a list of them) as a message shows it: 4 decimals, nan and inf as Python writes them."""
    if isinstance(value, list):
        return [_show(v) for v in value]
    return round(float(value), 4) if value is not None else None
