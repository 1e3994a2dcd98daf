"""Mixture-of-experts policies: where a model's routers are (found here, once), hooks on them, and the routing
statistics a run logs.

transformers declares, for each model class that has routers, which module's output holds the router logits (what its
own ``output_router_logits`` records: ``_can_record_outputs["router_logits"]``, a module class and the index of the
logits in that module's output). Qwen3-MoE's ``Qwen3MoeTopKRouter``, OLMoE's, Mixtral's and gpt-oss' routers return
``(router_logits, scores, indices)``: logits (N, E) for the N tokens of the call, the top-k weights and the experts
chosen. `routers` reads that declaration, so every family transformers ships is found by the same code, and every hook
on a router goes through `router_hooks` (recording the logits for the loss and the metrics, `RouterRecorder`;
replaying the sampler's choices in the trainer's forward: lightning_rl.core.routes). The declaration is a transformers
internal: its test (tests/lightning_rl/core/test_moe.py) names it and the version it was read from.

Statistics over the tokens that count (a mask), per layer l and expert i, with k experts per token:

    counts[l, i]   = sum_t 1[i in top_k(z_lt)]                       tokens routed to expert i
    load CV        = mean_l  std_i(counts[l]) / mean_i(counts[l])    0 when every expert gets as many tokens
    router entropy = mean_{t, l} H(softmax(z_lt))                    log E for a router that cannot choose

The chosen experts are the top k of the logits: what Qwen3-MoE's, OLMoE's, Mixtral's and gpt-oss' routers choose
(top k of softmax(z), or of z itself). A router that chooses otherwise (DeepSeek-V3's group-limited, biased choice)
is counted by its logits' top k.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import Tensor, nn

from lightning_rl.core import hf_attributes


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
    k = hf_attributes.experts_per_token(model.config)
    if k is not None:
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
