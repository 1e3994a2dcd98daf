"""`PolicyForward`: what one forward pass of the policy gives its loss, the one input of every loss term
(``lightning_rl.core.contracts.LossTerm``): the sampled tokens' log-probs always, and where a term reads them (its
``reads``) the entropy, the logits at the response positions (`ResponseLogits`: distillation's full distribution) and
a mixture-of-experts policy's router logits (`RouterLogits`: a load-balancing loss, the routing metrics).

The logits and router logits are laid out as the forward computed them: (B, R, ...) for padded rows, or (N, ...) over
the real response tokens of a packed row; ``align`` lays a batch field out the same way and ``scatter`` brings
per-position values back to (B, R).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

from torch import Tensor


class _Positions:
    """Where the rows of a forward's output sit in the batch: ``token_mask`` (B, R) bool, the packed layout's
    positions (None: not packed), and ``scatter_to``, their way back to (B, R)."""

    token_mask: Tensor | None
    scatter_to: Callable[[Tensor], Tensor] | None

    def align(self, field: Tensor) -> Tensor:
        """A (B, R, ...) batch field laid out as the output is. Shape: (B, R, ...) -> (B, R, ...) or (N, ...)."""
        return field if self.token_mask is None else field[self.token_mask]

    def scatter(self, values: Tensor) -> Tensor:
        """Per-position values back to the batch's layout, zero on padding. Shape: (B, R) or (N,) -> (B, R)."""
        return values if self.scatter_to is None else self.scatter_to(values)


@dataclass
class ResponseLogits(_Positions):
    """The policy's logits at the response positions: (B, R, V), or (N, V) over the real tokens of a packed row."""

    logits: Tensor  # (B, R, V) or (N, V), with gradient
    temperature: float  # the sampling temperature the policy's distribution is taken at: softmax(logits / T)
    token_mask: Tensor | None = None  # (B, R) bool: the packed layout's positions (None: not packed)
    scatter_to: Callable[[Tensor], Tensor] | None = None


@dataclass
class RouterLogits(_Positions):
    """A mixture-of-experts policy's router logits at the positions whose outputs predict the response tokens (the
    prompt's last position, then each response token but the last): every router (layer) of the model, in order."""

    logits: Tensor  # (B, R, L, E) or (N, L, E), with gradient: L routers of E experts
    top_k: int  # the experts each token is routed to
    token_mask: Tensor | None = None  # (B, R) bool: the packed layout's positions (None: not packed)
    scatter_to: Callable[[Tensor], Tensor] | None = None


@dataclass
class PolicyForward:
    """One forward of the policy on a micro-batch, as the loss reads it. Fields other than ``logprobs`` are None unless
    a loss term reads them (``LossTerm.reads`` names them), except ``entropy`` (always, as a metric: with gradient only
    where a term reads it) and ``router_logits`` (always for a mixture-of-experts policy: the routing metrics)."""

    logprobs: Tensor  # (B, R) fp32, with gradient: log pi_theta(y_t | x, y_<t) at the sampling temperature
    entropy: Tensor | None = None  # (B, R) fp32: the tempered policy's entropy at each response position
    logits: ResponseLogits | None = None
    router_logits: RouterLogits | None = None


READABLE = frozenset(f.name for f in fields(PolicyForward)) - {"logprobs"}
"""What a loss term may declare in ``reads`` (the log-probs are always there)."""
