"""Mixture-of-experts policies: where a model's routers are (found here, once), hooks on them, and the routing
statistics a run logs.

transformers declares, for each model class that has routers, which module's output holds the router logits (what its
own ``output_router_logits`` records: ``_can_record_outputs["router_logits"]``, a module class and the index of the
logits in that module's output). Qwen3-MoE's ``Qwen3MoeTopKRouter``, OLMoE's, Mixtral's and gpt-oss' routers return
``(router_logits, scores, indices)``: logits (N, E) for the N tokens of the call, the top-k weights and the experts
chosen. `routers` reads that declaration, so every family transformers ships is found by the same code, and every hook
on a router goes through `router_hooks` (recording the logits for the loss and the metrics, `RouterRecorder`;
replaying the sampler's choices in the trainer's forward). The declaration is a transformers internal: its test
(tests/lightning_rl/core/test_moe.py) names it and the version it was read from.

Statistics over the tokens that count (a mask), per layer l and expert i, with k experts per token:

    counts[l, i]   = sum_t 1[i in top_k(z_lt)]                       tokens routed to expert i
    load CV        = mean_l  std_i(counts[l]) / mean_i(counts[l])    0 when every expert gets as many tokens
    router entropy = mean_{t, l} H(softmax(z_lt))                    log E for a router that cannot choose

The chosen experts are the top k of the logits: what Qwen3-MoE's, OLMoE's, Mixtral's and gpt-oss' routers choose
(top k of softmax(z), or of z itself). A router that chooses otherwise (DeepSeek-V3's group-limited, biased choice)
is counted by its logits' top k.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Router:
    """One MoE layer's router: ``layer`` counts the model's routers in module order (0 = the first MoE layer)."""

    layer: int
    name: str  # the module's name in the model
    module: nn.Module
    logits_index: int  # where the module's output holds the router logits (N, E)


def _declarations(model: nn.Module) -> list:
    """transformers' declarations of the router-logits outputs of ``model`` and of the models inside it (a
    vision-language model's text model): ``OutputRecorder`` objects, with ``target_class``, ``index`` and
    ``layer_name``."""
    found = []
    for module in model.modules():
        recorders = getattr(type(module), "_can_record_outputs", None) or {}
        recorder = recorders.get("router_logits")
        if recorder is not None and all(recorder is not r for r in found):
            found.append(recorder)
    return found


def routers(model: nn.Module) -> list[Router]:
    """Every router of ``model``, in module order; [] for a dense model."""
    declared = _declarations(model)
    found = []
    for name, module in model.named_modules():
        for recorder in declared:
            if _declared(recorder, name, module):
                found.append(Router(len(found), name, module, recorder.index))
                break
    return found


def _declared(recorder, name: str, module: nn.Module) -> bool:
    """Whether ``module`` (named ``name``) is what ``recorder`` records: its class (or a class named so), under its
    layer name when it gives one."""
    target, class_name = recorder.target_class, recorder.class_name
    if class_name is not None:
        of_class = type(module).__name__.endswith(class_name)
    else:
        of_class = isinstance(target, type) and isinstance(module, target)
    return of_class and (recorder.layer_name is None or recorder.layer_name in name)


def is_moe(model: nn.Module) -> bool:
    return bool(routers(model))


def experts_per_token(model: nn.Module) -> int:
    """k, the experts each token is routed to (the config's ``num_experts_per_tok``, a text model's for a
    vision-language model)."""
    config = model.config
    for part in (config, getattr(config, "text_config", None)):
        k = getattr(part, "num_experts_per_tok", None)
        if isinstance(k, int) and k > 0:
            return k
    raise ValueError(
        f"{type(model).__name__} has routers but its config gives no num_experts_per_tok: the experts each token is "
        "routed to are unknown"
    )


RouterHook = Callable[[Router, tuple], "tuple | None"]
"""``hook(router, output)`` after a router's forward; a returned tuple replaces its output (None keeps it)."""


@contextmanager
def router_hooks(model: nn.Module, hook: RouterHook) -> Iterator[list[Router]]:
    """``hook`` on every router of ``model`` while the block runs (the routers are yielded); removed on exit, so a
    forward recomputed in the backward pass (activation checkpointing) runs without it."""
    found = routers(model)
    handles = [
        router.module.register_forward_hook(lambda module, args, output, router=router: hook(router, output))
        for router in found
    ]
    try:
        yield found
    finally:
        for handle in handles:
            handle.remove()


class RouterRecorder:
    """Records every router's logits, call by call, while `recording` runs: `take` gives the last call's, stacked.

    The logits keep their gradient (a load-balancing loss trains the routers through them)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self._calls: dict[int, list[Tensor]] = {}

    @contextmanager
    def recording(self) -> Iterator[None]:
        self._calls = {}

        def record(router: Router, output: tuple) -> None:
            self._calls.setdefault(router.layer, []).append(output[router.logits_index])

        with router_hooks(self.model, record) as found:
            if not found:
                raise ValueError(f"{type(self.model).__name__} has no router to record: it is not a mixture of experts")
            yield

    def take(self, rows: int, length: int) -> Tensor:
        """The router logits of the model call just made on ``rows`` x ``length`` tokens. Shape: (rows, length, L, E)."""
        layers = [self._calls[layer].pop(0) for layer in sorted(self._calls)]  # each (rows * length, E)
        return torch.stack(layers, dim=1).reshape(rows, length, len(layers), -1)


def chosen_experts(logits: Tensor, k: int) -> Tensor:
    """1 where an expert is among a token's top ``k`` at a layer, else 0 (no gradient). Shape: (..., E) -> (..., E)."""
    top = logits.detach().topk(k, dim=-1).indices
    return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, top, 1.0)


def expert_counts(logits: Tensor, mask: Tensor, k: int) -> Tensor:
    """Tokens routed to each expert of each layer, over the tokens ``mask`` counts. Shapes: (..., L, E), (...) -> (L, E)."""
    chosen = chosen_experts(logits, k) * mask.float()[..., None, None]  # (..., L, E)
    return chosen.reshape(-1, *logits.shape[-2:]).sum(0)


def load_cv(counts: Tensor) -> Tensor:
    """Coefficient of variation of the tokens per expert (population std / mean over experts), averaged over layers;
    0 for a layer that routed no token. Shape: (L, E) -> ()."""
    counts = counts.double()
    mean = counts.mean(-1)  # (L,)
    cv = counts.std(-1, correction=0) / mean.clamp_min(1e-12)
    return torch.where(mean > 0, cv, torch.zeros_like(cv)).mean().float()


def router_entropy(logits: Tensor, mask: Tensor) -> Tensor:
    """Entropy of each router's distribution softmax(z), averaged over layers, summed over the tokens ``mask`` counts
    (divide by ``mask.sum()`` for the mean). Shapes: (..., L, E), (...) -> ()."""
    logp = torch.log_softmax(logits.detach().float(), dim=-1)  # (..., L, E)
    entropy = -(logp.exp() * logp).sum(-1).mean(-1)  # (...,)
    return (entropy * mask.float()).sum()


# ---------------------------------------------------------------------------------------------- routes and replay

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
