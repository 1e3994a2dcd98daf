"""Step metrics: weighted means kept as tensors until the module logs them once per iteration."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch
from torch import Tensor

from lightning_rl.core.forward_outputs import RouterLogits
from lightning_rl.core.moe import expert_counts, load_cv, router_entropy
from lightning_rl.core.ops import all_reduce_sum, dist_ready
from lightning_rl.core.routes import route_agreement, routes_agree, sampler_routes


class WeightedMeans:
    """Accumulate ``value * weight`` per name over micro-batches, and maxima / minima; one all-reduce each at the end
    (no host syncs in between).

    ``device``: where every sum lives (the module's). Host values (a wall-clock wait, a CPU reward's metrics) move
    there as they are added: the reduction stacks all of them, and CUDA (like NCCL) refuses a mix of devices.
    None keeps each value where it is."""

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = None if device is None else torch.device(device)
        self.sums: dict[str, Tensor] = {}
        self.weights: dict[str, Tensor] = {}
        self.maxima: dict[str, Tensor] = {}
        self.minima: dict[str, Tensor] = {}
        self.distributions: dict[str, list[Tensor]] = {}
        """This rank's values of each distribution (`values`), for a histogram; never reduced over ranks."""

    def add(self, name: str, value: Tensor, weight: Tensor | float = 1.0) -> None:
        """A weighted value of the mean ``name``; a name ending in ``_max`` is a maximum instead (`maximum`)."""
        value = self._here(value)
        if name.endswith("_max"):
            self.maximum(name, value)
            return
        weight = torch.as_tensor(weight, dtype=torch.float32, device=value.device)
        self.sums[name] = self.sums.get(name, 0.0) + value * weight
        self.weights[name] = self.weights.get(name, 0.0) + weight

    def _here(self, value: Tensor) -> Tensor:
        value = value.detach().float()
        return value if self.device is None else value.to(self.device, non_blocking=True)

    def maximum(self, name: str, value: Tensor) -> None:
        """``name`` is the largest value given, over calls and ranks."""
        value = self._here(value)
        self.maxima[name] = value if name not in self.maxima else torch.maximum(self.maxima[name], value)

    def minimum(self, name: str, value: Tensor) -> None:
        """``name`` is the smallest value given, over calls and ranks."""
        value = self._here(value)
        self.minima[name] = value if name not in self.minima else torch.minimum(self.minima[name], value)

    def values(self, name: str, values: Tensor) -> None:
        """Every element of ``values`` joins the distribution ``name`` (a TensorBoard histogram: this rank's rows)."""
        self.distributions.setdefault(name, []).append(values.detach().float().flatten())

    def distribution(self, name: str) -> Tensor | None:
        """The values given to ``name`` so far on this rank, in one tensor; None when none were."""
        parts = self.distributions.get(name)
        return torch.cat([p.to(parts[0].device) for p in parts]) if parts else None

    def add_all(self, metrics: dict[str, Tensor], weight: Tensor | float = 1.0) -> None:
        for name, value in metrics.items():
            self.add(name, value, weight)

    def running(self, name: str) -> Tensor:
        """(sum of value * weight, sum of weight) for ``name`` so far, on this rank. Shape: (2,)."""
        zero = torch.zeros(())
        return torch.stack(
            [
                torch.as_tensor(self.sums.get(name, zero)).float().cpu(),
                torch.as_tensor(self.weights.get(name, zero)).float().cpu(),
            ]
        )

    def compute(self, sync: bool = True) -> dict[str, Tensor]:
        """Means, maxima and minima over everything added, across data-parallel ranks when ``sync``."""
        names = sorted(self.sums)
        out: dict[str, Tensor] = {}
        if names:
            stacked = torch.stack([torch.stack([self.sums[n], self.weights[n]]) for n in names])  # (M, 2)
            if sync:
                stacked = all_reduce_sum(stacked)
            out.update({n: s / w.clamp_min(1e-12) for n, (s, w) in zip(names, stacked)})
        for extremes, op in ((self.maxima, "MAX"), (self.minima, "MIN")):
            if extremes:
                names = sorted(extremes)
                stacked = torch.stack([extremes[n] for n in names])
                if sync and dist_ready():
                    torch.distributed.all_reduce(stacked, op=getattr(torch.distributed.ReduceOp, op))
                out.update(dict(zip(names, stacked)))
        return out


class ExpertLoad:
    """A mixture-of-experts policy's routing in one iteration's update, over the tokens that count:
    ``moe/router_entropy`` (the routers' mean entropy) and ``moe/expert_load_cv`` (the coefficient of variation of the
    tokens per expert, per layer, averaged over layers: lightning_rl.core.moe), taken once from the counts of every
    micro-batch and rank, so it is the iteration's load and not a mean of small batches' ones. With the sampler's routes
    on the batch, ``moe/route_agreement``: the fraction of the sampler's token x layer x k routes the trainer's own
    routers also choose (the router's choice, also when replay forces the sampler's), and with the sampler's log-probs
    the trainer/sampler gap split by whether a token's routes all agree: ``moe/logprob_diff_mean_agreeing`` and
    ``moe/logprob_diff_mean_disagreeing``."""

    def __init__(self) -> None:
        self.counts: Tensor | None = None  # (L, E)

    def add(
        self, router: RouterLogits, mask: Tensor, metrics: WeightedMeans, batch=None, diff: Tensor | None = None
    ) -> None:
        """One micro-batch's routers; ``mask`` (B, R): the tokens that count; ``batch``: the micro-batch (its routes);
        ``diff`` (B, R): |trainer - sampler| log-prob of each token."""
        given = None if batch is None else sampler_routes(batch.prompt_routed_experts, batch.routed_experts)
        if given is not None:  # (B, R, L, K) where the router logits are taken
            hits, total = route_agreement(router.logits, router.align(given), router.align(mask))
            metrics.add("moe/route_agreement", hits / total.clamp_min(1), total)
            if diff is not None:
                agree = routes_agree(router.logits, router.align(given)).float()  # (B, R) or (N,)
                counted, gap = router.align(mask).float(), router.align(diff)
                for tag, part in (
                    ("moe/logprob_diff_mean_agreeing", agree),
                    ("moe/logprob_diff_mean_disagreeing", 1.0 - agree),
                ):
                    tokens = (counted * part).sum()
                    metrics.add(tag, (gap * counted * part).sum() / tokens.clamp_min(1), tokens)
        mask = router.align(mask)
        counts = expert_counts(router.logits, mask, router.top_k)
        self.counts = counts if self.counts is None else self.counts + counts
        tokens = mask.sum()
        metrics.add("moe/router_entropy", router_entropy(router.logits, mask) / tokens.clamp_min(1), tokens)

    def report(self, metrics: WeightedMeans) -> None:
        if self.counts is not None:
            metrics.add("moe/expert_load_cv", load_cv(all_reduce_sum(self.counts)))


class PhaseTimer:
    """Wall-clock seconds per phase of one iteration (``time/<phase>_s``), and since the iteration began (``time/iteration_s``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.started = time.perf_counter()

    @contextmanager
    def __call__(self, phase: str):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.seconds[phase] += time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}_s": v for k, v in self.seconds.items()}

    def elapsed(self) -> float:
        """Seconds since the iteration began: its phases and what ran between them."""
        return time.perf_counter() - self.started
