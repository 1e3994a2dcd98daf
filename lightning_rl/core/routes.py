"""Routing replay: a mixture-of-experts sampler's routes (the experts each router chose for each token it fed its
model), recorded (`RouteRecorder`), laid out for the trainer (`batch_routes`, `sampler_routes`), replayed in the
trainer's forward (`replaying`: "R3", Ma et al. 2025, arXiv:2510.11370) and compared with the trainer's own choice
(`route_agreement`, `routes_agree`). The routers are found and hooked by lightning_rl.core.moe.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn

from lightning_rl.core.moe import Router, chosen_experts, router_hooks, routers

Routes = tuple[Tensor, Tensor]
"""A sampler's routes to replay: the prompt's (B, P, L, K) and the response's (B, R, L, K), -1 where unknown."""

_GATES = {
    # router class: (renormalise the k gates: the config attribute read, or True; cast the gates to the logits' dtype)
    "Qwen3MoeTopKRouter": ("norm_topk_prob", True),
    "OlmoeTopKRouter": ("norm_topk_prob", True),
    "MixtralTopKRouter": (True, False),
}
"""The routers replay supports, read from transformers 5.25's modeling files: each computes softmax(z) in fp32, takes
its top k, renormalises them (Qwen3-MoE and OLMoE when ``norm_topk_prob``, Mixtral always) and returns
``(logits, gates, experts)``."""


def replay_unsupported(model: nn.Module) -> str | None:
    """Why routing replay cannot run on ``model`` (one line), or None when every router is one it supports."""
    found = routers(model)
    if not found:
        return (
            f"model.routing_replay: {type(model).__name__} has no router (not a mixture of experts), so there is no "
            "route to replay; set model.routing_replay: false"
        )
    other = sorted({type(r.module).__name__ for r in found} - set(_GATES))
    if other:
        return (
            f"model.routing_replay: routers of class {other} are not supported (supported: {sorted(_GATES)}); set "
            "model.routing_replay: false"
        )
    return None


def replayed_gates(router: nn.Module, logits: Tensor, experts: Tensor) -> Tensor:
    """The gate weights of ``experts`` (N, K) as ``router`` computes them from its logits (N, E): softmax(z)_e over the
    given experts, renormalised as its config says, so the gradient reaches the router as in its own forward.

        g_e = softmax(z)_e / sum_{e' in experts} softmax(z)_e'    (renormalised; softmax(z)_e otherwise)
    """
    norm, cast = _GATES[type(router).__name__]
    if isinstance(norm, str):
        norm = bool(getattr(router, norm))
    gates = torch.softmax(logits, dim=-1, dtype=torch.float).gather(-1, experts)  # (N, K)
    if norm:
        gates = gates / gates.sum(-1, keepdim=True)
    return gates.to(logits.dtype) if cast else gates


@contextmanager
def replaying(model: nn.Module, routes: Tensor | None) -> Iterator[None]:
    """Every router of ``model`` routes the tokens of the next call as ``routes`` say (rows, length, L, K), -1 where the
    router chooses itself; the gates come from the router's current logits (`replayed_gates`). None: no replay."""
    if routes is None:
        yield
        return
    flat = routes.reshape(-1, *routes.shape[-2:])  # (N, L, K)

    def replay(router: Router, output: tuple) -> tuple:
        logits, _, own = output  # (N, E), (N, K), (N, K)
        given = flat[:, router.layer].to(own.device)
        experts = torch.where(given >= 0, given, own)
        return logits, replayed_gates(router.module, logits, experts), experts

    with router_hooks(model, replay):
        yield


class RouteRecorder:
    """The experts every router chose, call by call, while `recording` runs (a sampler's prefill and steps): `take`
    gives the last call's, stacked. Shape: (rows, length, L, K) long. Only the calls of the thread that records count
    (a server samples for several requests at once on one model)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self._calls: dict[int, list[Tensor]] = {}

    @contextmanager
    def recording(self) -> Iterator[None]:
        self._calls = {}
        thread = threading.get_ident()

        def record(router: Router, output: tuple) -> None:
            if threading.get_ident() == thread:
                self._calls.setdefault(router.layer, []).append(output[-1])

        with router_hooks(self.model, record):
            yield

    def pending(self) -> int:
        """Calls recorded and not yet taken."""
        return len(next(iter(self._calls.values()), []))

    def take(self, rows: int, length: int) -> Tensor:
        layers = [self._calls[layer].pop(0) for layer in sorted(self._calls)]  # each (rows * length, K)
        return torch.stack(layers, dim=1).reshape(rows, length, len(layers), -1).long()


def sampler_routes(prompt_routes: Tensor | None, routes: Tensor | None) -> Tensor | None:
    """The sampler's routes at the positions whose outputs predict the response tokens (the prompt's last position,
    then each response token but the last): where `RouterLogits` are taken. Shapes: (B, P, L, K), (B, R, L, K) ->
    (B, R, L, K); None without response routes."""
    if routes is None:
        return None
    last = prompt_routes[:, -1:] if prompt_routes is not None else torch.full_like(routes[:, :1], -1)
    return torch.cat([last, routes[:, :-1]], dim=1)


def route_agreement(logits: Tensor, given: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """How many of the sampler's routes ``given`` the trainer's own routers (top k of ``logits``) also choose, over the
    tokens ``mask`` counts whose routes are known: (agreeing token x layer x k routes, routes compared). Shapes:
    (..., L, E), (..., L, K), (...) -> (), ()."""
    k = given.shape[-1]
    own = chosen_experts(logits, k)  # (..., L, E)
    known = (given >= 0).all(-1).all(-1) & (mask != 0)  # (...,)
    hits = own.gather(-1, given.clamp_min(0)).sum(-1).sum(-1)  # (...,)
    weight = known.float()
    return (hits * weight).sum(), weight.sum() * given.shape[-2] * k


def routes_agree(logits: Tensor, given: Tensor) -> Tensor:
    """Whether the trainer's own routers choose, at every layer, the experts the sampler chose (``given``), for each
    token whose routes are known. Shapes: (..., L, E), (..., L, K) -> (...) bool."""
    k = given.shape[-1]
    hits = chosen_experts(logits, k).gather(-1, given.clamp_min(0)).sum(-1)  # (..., L)
    return (hits == k).all(-1) & (given >= 0).all(-1).all(-1)


def batch_routes(batch) -> Routes:
    """The sampler's routes on ``batch`` to replay: (prompt, response), the prompt's -1 (the router's own) where the
    sampler gave none."""
    if batch.routed_experts is None:
        raise ValueError(
            "model.routing_replay: this batch has no routed_experts (the sampler's routes); use a rollout that records "
            "them (HFRollout; SGLangRollout or VLLMRollout with return_routes: true), or set model.routing_replay: false"
        )
    response = batch.routed_experts  # (B, R, L, K)
    prompt = batch.prompt_routed_experts
    if prompt is None:
        prompt = response.new_full((response.shape[0], batch.prompt_ids.shape[1], *response.shape[2:]), -1)
    return prompt, response
