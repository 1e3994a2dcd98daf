"""The Tinker API's built-in losses as our components: each name maps to a `Surrogate` built from
``loss_fn_config``, the datum's ``loss_fn_inputs`` laid into a `RolloutBatch`, and `TokenSum` reducing it (the Tinker
losses are sums over tokens, ``loss:sum``).

A datum of N positions predicts ``target_tokens[i]`` from ``model_input[: i + 1]``; the batch's "response" is the N
targets, every position of every datum counting (``response_mask``), unless a loss restricts it (``action_mask``):

    cross_entropy        -(weights log p)                 PolicyGradient with A = weights (default 1)
    importance_sampling  -(p / q) A                       ImportanceSampling
    ppo                  -min(r A, clip(r, lo, hi) A)     ClippedSurrogate, lo/hi = clip_low/high_threshold (0.8, 1.2)
    cispo                -sg(clip(r, lo, hi)) A log p     CISPO, same thresholds
    gspo                 PPO on the sequence ratio        ClippedSurrogate(level=sequence) over sequence_ratio_mask
                                                          (default: every position), thresholds 1 -/+ 3e-4 / 4e-4
    dro                  -(A log p - beta/2 (log p/q)^2)  DRO, beta (0.05)
    stable_reinforce     PPO with Pre-CLIP and a filter   StableReinforce over the sampled positions named by the
                                                          datum's provenance; kl_coeff (0)

with q the ``logprobs`` input (the sampler's), r = p / q and A ``advantages``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from components.aggregator import TokenSum
from components.surrogate import CISPO, DRO, ClippedSurrogate, ImportanceSampling, PolicyGradient, StableReinforce
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Surrogate
from lightning_rl.service.errors import BadRequest

RL_INPUTS = frozenset({"target_tokens", "logprobs", "advantages"})


def _thresholds(config: dict, low: float, high: float) -> tuple[float, float]:
    low, high = float(config.get("clip_low_threshold", low)), float(config.get("clip_high_threshold", high))
    if not 0 < low < 1 < high:
        raise BadRequest(
            f"loss_fn_config: need 0 < clip_low_threshold < 1 < clip_high_threshold, got {low} and {high}",
            "loss_fn_config.clip_low_threshold",
        )
    return 1.0 - low, high - 1.0


def _ppo(config: dict) -> Surrogate:
    eps_low, eps_high = _thresholds(config, 0.8, 1.2)
    return ClippedSurrogate(eps_low=eps_low, eps_high=eps_high)


def _cispo(config: dict) -> Surrogate:
    eps_low, eps_high = _thresholds(config, 0.8, 1.2)
    return CISPO(eps_low=eps_low, eps_high=eps_high)


def _gspo(config: dict) -> Surrogate:
    eps_low, eps_high = _thresholds(config, 1 - 3e-4, 1 + 4e-4)  # GSPO's ranges (arXiv:2507.18071, section 5.1)
    return ClippedSurrogate(eps_low=eps_low, eps_high=eps_high, level="sequence")


def _dro(config: dict) -> Surrogate:
    beta = float(config.get("beta", 0.05))
    if not beta > 0:
        raise BadRequest(f"loss_fn_config.beta must be > 0, got {beta}", "loss_fn_config.beta")
    return DRO(beta=beta)


def _stable_reinforce(config: dict) -> Surrogate:
    eps_low, eps_high = _thresholds(config, 0.8, 1.2)
    kl_coeff = float(config.get("kl_coeff", 0.0))
    if kl_coeff < 0:
        raise BadRequest(f"loss_fn_config.kl_coeff must be >= 0, got {kl_coeff}", "loss_fn_config.kl_coeff")
    return StableReinforce(eps_low=eps_low, eps_high=eps_high, kl_coeff=kl_coeff)


@dataclass(frozen=True)
class Loss:
    """One Tinker loss: the inputs it needs and may take, the config keys it reads, and its surrogate."""

    name: str
    required: frozenset[str]
    optional: frozenset[str]
    config: frozenset[str]
    surrogate: Callable[[dict], Surrogate]
    masked_by: str | None = None
    """An input whose nonzero positions are the ones the loss covers (None: every position)."""
    needs_sampled_positions: bool = False
    """The loss covers the positions the datum's provenance names as sampled tokens."""


THRESHOLDS = frozenset({"clip_low_threshold", "clip_high_threshold"})
LOSSES = {
    loss.name: loss
    for loss in [
        Loss(
            "cross_entropy",
            frozenset({"target_tokens"}),
            frozenset({"weights"}),
            frozenset(),
            lambda c: PolicyGradient(),
        ),
        Loss("importance_sampling", RL_INPUTS, frozenset(), frozenset(), lambda c: ImportanceSampling()),
        Loss("ppo", RL_INPUTS, frozenset(), THRESHOLDS, _ppo),
        Loss("cispo", RL_INPUTS, frozenset(), THRESHOLDS, _cispo),
        Loss("gspo", RL_INPUTS, frozenset({"sequence_ratio_mask"}), THRESHOLDS, _gspo, "sequence_ratio_mask"),
        Loss("dro", RL_INPUTS, frozenset(), frozenset({"beta"}), _dro),
        Loss(
            "stable_reinforce",
            RL_INPUTS - {"logprobs"},
            frozenset({"logprobs"}),
            THRESHOLDS | {"kl_coeff"},
            _stable_reinforce,
            needs_sampled_positions=True,
        ),  # fmt: skip
    ]
}
AGGREGATOR = TokenSum()


def loss_named(name: str, config: dict) -> tuple[Loss, Surrogate]:
    """The loss ``name`` and its surrogate for ``config``; an unknown name or key is a `BadRequest` naming it."""
    if name not in LOSSES:
        if name == "custom":
            raise BadRequest(
                "loss_fn='custom' runs a loss uploaded with create_custom_loss, which this service does not take: "
                "forward_backward_custom runs the loss in the client (this service answers custom_loss_server_side "
                "false) over cross_entropy",
                "loss_fn",
            )
        raise BadRequest(f"loss_fn {name!r} is not one of {sorted(LOSSES)}", "loss_fn")
    loss = LOSSES[name]
    unknown = sorted(set(config) - loss.config)
    if unknown:
        accepted = ", ".join(sorted(loss.config)) or "none"
        raise BadRequest(
            f"loss_fn_config.{unknown[0]}: {name} reads no such key (it reads: {accepted})",
            f"loss_fn_config.{unknown[0]}",
        )
    if any(isinstance(value, str) for value in config.values()):
        key = next(k for k, v in config.items() if isinstance(v, str))
        raise BadRequest(f"loss_fn_config.{key} must be a number", f"loss_fn_config.{key}")
    return loss, loss.surrogate(config)


def loss_batch(
    loss: Loss, targets: Tensor, valid: Tensor, inputs: dict[str, Tensor], sampled: Tensor | None
) -> RolloutBatch:
    """The batch a surrogate reads, from datums padded to (B, N): ``targets`` long, ``valid`` 1 on real positions,
    ``inputs`` name -> (B, N) float, ``sampled`` (B, N) 1 on the positions provenance names sampled (or None)."""
    if loss.name == "cross_entropy":
        advantages = inputs.get("weights", valid.float())
        return RolloutBatch(response_ids=targets, response_mask=valid, advantages=advantages)
    action_mask = None
    if loss.masked_by is not None and loss.masked_by in inputs:
        action_mask = (inputs[loss.masked_by] != 0).long()
    if loss.needs_sampled_positions:
        action_mask = sampled
    return RolloutBatch(
        response_ids=targets,
        response_mask=valid,
        old_logprobs=inputs["logprobs"],
        advantages=inputs["advantages"],
        action_mask=action_mask,
    )


def loss_of(surrogate: Surrogate, logprobs: Tensor, batch: RolloutBatch) -> tuple[Tensor, dict[str, Tensor]]:
    """The summed loss of a (micro-)batch and the surrogate's metrics. Shapes: (B, N) -> ()."""
    per_token, metrics = surrogate(logprobs, batch)  # (B, N)
    return AGGREGATOR(per_token, batch.loss_mask, torch.ones(())), metrics
