"""Exact verification of a push: the server's own checksums of what it holds, before and after the push, against what
the trainer changed.

An engine hashes its weights as it holds them (SGLang's ``/weights_checker``, vLLM's ``/weight_checker``): fused (q, k
and v in one ``qkv_proj``; gate and up in one ``gate_up_proj``), split over tensor-parallel ranks, the vocabulary
padded, in the server's dtype, with a GPU hash on GPUs; no digest the trainer computes equals those. What can be checked
exactly is change: every tensor whose value the trainer changed since the push before (`fingerprints`) must have
changed on the server, under the name the server gives it, on every rank that holds it: each tensor-parallel,
pipeline and data-parallel rank of a server hashes its own copy (`Checksums`), and a rank that did not load the push
keeps its checksum however the others moved. A tensor the server did not load is named in the error, with the rank
where the server has several. (A tensor sharded over ranks whose change touched one shard only, e.g. embedding rows
of tokens one rank holds, reads as not loaded on the others: the error names them.)

Names are matched through the engine's fusions (``layers.0.self_attn.k_proj`` is the server's
``layers.0.self_attn.qkv_proj``; with LoRA enabled vLLM holds it as ``qkv_proj.base_layer``; a mixture of experts'
``mlp.experts.3.gate_proj.weight``, expert 3's slice of the checkpoint, is SGLang's ``mlp.experts.w13_weight`` and
vLLM's ``mlp.experts.routed_experts.w13_weight``, all experts' gate and up projections in one (E, 2I, H) tensor) and
then by the longest unique suffix (a server may root its module tree elsewhere: ``model.visual.`` for ``visual.``,
``model.language_model.layers.`` for ``model.layers.``). A changed tensor the server reports no checksum for fails the
check, naming the tensors the server holds beside it: exact means nothing is skipped, and a name the engine's fusions
do not map is a push that may not have landed (a loader skips the names it does not know), so the fix is the map.

What this cannot see, the probe checks numerically: a tensor fused with one that did change (a stale ``k_proj`` beside
a changed ``q_proj``; one stale expert beside changed ones of its layer), the first push of a run (no push before it to
compare with), a push after a failed one (what the failed one left is unknown), a change finer than bf16.
"""

from __future__ import annotations

import re
from collections import defaultdict

from .http import ServerError

Checksums = dict[str, dict[str, str]]
"""A server's checksums: {its tensor name: {rank: digest}}, one digest per rank that holds the tensor (a rank as the
engine names it, e.g. vLLM's ``dp0:pp0:pcp0:tp1``)."""


class ServerNames:
    """Finds the server's name for a tensor the trainer pushed. ``fusions``: a module name part to the engine's
    (``k_proj``: ``qkv_proj``), or, for a key with a ``*`` part (any expert's index), the end of a name to the engine's
    (``experts.*.down_proj.weight``: ``experts.w2_weight``)."""

    def __init__(self, names, fusions: dict[str, str]):
        self.names = set(names)
        self.fusions = {k: v for k, v in fusions.items() if "." not in k}
        self.patterns = [
            (re.compile(r"(^|\.)" + re.escape(k).replace(r"\*", r"\d+") + "$"), v)
            for k, v in fusions.items()
            if "." in k
        ]
        self._by_suffix: dict[str, set[str]] = defaultdict(set)
        for name in self.names:
            parts = name.split(".")
            for k in range(len(parts)):
                self._by_suffix[".".join(parts[k:])].add(name)

    def fused(self, pushed: str) -> str:
        """``pushed`` under the engine's fusions."""
        for pattern, target in self.patterns:
            found = pattern.search(pushed)
            if found:
                return pushed[: found.start()] + found.group(1) + target
        return ".".join(self.fusions.get(part, part) for part in pushed.split("."))

    def beside(self, pushed: str, most: int = 3) -> list[str]:
        """The server's names under the deepest module of ``pushed`` it holds anything under (what to map it to)."""
        parts = pushed.split(".")
        for k in range(len(parts) - 1, 0, -1):
            prefix = ".".join(parts[:k]) + "."
            found = sorted(n for n in self.names if n.startswith(prefix))
            if found:
                return found[:most]
        return []

    def __call__(self, pushed: str) -> str | None:
        fused = self.fused(pushed)
        for candidate in dict.fromkeys([pushed, fused]):
            for name in (candidate, *_wrapped(candidate)):
                if name in self.names:
                    return name
        for candidate in dict.fromkeys([pushed, fused]):
            parts = candidate.split(".")
            for k in range(1, len(parts) - 1):  # at least a module and the tensor
                suffix = ".".join(parts[k:])
                found = set().union(*(self._by_suffix.get(s, set()) for s in (suffix, *_wrapped(suffix))))
                if len(found) == 1:
                    return next(iter(found))
                if len(found) > 1:
                    break
        return None


def _wrapped(name: str) -> list[str]:
    """``name`` under ``base_layer``, deepest first: a layer an engine wraps for LoRA holds its own weights there
    (``qkv_proj.base_layer.weight``; vLLM's experts: ``experts.base_layer.routed_experts.w13_weight``)."""
    parts = name.split(".")
    return [".".join([*parts[:k], "base_layer", *parts[k:]]) for k in range(len(parts) - 1, 0, -1)]


def stale_tensors(
    changed: list[str], before: Checksums, after: Checksums, fusions: dict[str, str]
) -> tuple[list[tuple[str, str, list[str]]], list[str]]:
    """(pushed name, server name, the ranks where it kept its checksum) of every changed tensor that some rank of the
    server did not load, and the changed tensors the server reports no checksum for."""
    names = ServerNames(after, fusions)
    stale, unknown = [], []
    for pushed in changed:
        served = names(pushed)
        if served is None:
            unknown.append(pushed)
            continue
        held = before.get(served, {})
        kept = [rank for rank, digest in after[served].items() if held.get(rank) == digest]
        if kept:
            stale.append((pushed, served, kept))
    return stale, unknown


def checksum_finding(
    error: type[ServerError],
    url: str,
    changed: list[str],
    before: Checksums,
    after: Checksums,
    fusions: dict[str, str],
    engine: str = "the engine",
) -> str | None:
    """What the server's checksums say is missing from the push (None: nothing); ``error`` naming ``url`` when a
    changed tensor has no checksum on the server. ``engine``: where the engine's fusions are (the fix)."""
    stale, unknown = stale_tensors(changed, before, after, fusions)
    if unknown:
        held = ServerNames(after, fusions).beside(unknown[0])
        raise error(
            f"{error.engine} server at {url}: its weight checksums name none of {unknown[:5]}"
            f"{f' (and {len(unknown) - 5} more)' if len(unknown) > 5 else ''}, which the push changed, so it is not "
            f"known to have loaded them (a loader skips names it does not know). It holds {held or 'nothing near them'}"
            f"{' beside the first' if held else ''}: map the pushed names to the server's in {engine}.fusions"
        )
    if not stale:
        return None
    several = len({rank for digests in after.values() for rank in digests}) > 1
    by_served: dict[tuple[str, tuple[str, ...]], list[str]] = defaultdict(list)  # a fused tensor once, with its parts
    for pushed, served, ranks in stale:
        by_served[served, tuple(ranks)].append(pushed)
    shown = ", ".join(
        pushed[0] + (f" and {len(pushed) - 1} more" if len(pushed) > 1 else "")
        + ("" if pushed == [served] else f" (the server's {served})")
        + (f" on rank {', '.join(ranks)}" if several else "")
        for (served, ranks), pushed in list(by_served.items())[:5]
    )  # fmt: skip
    return (
        f"{len(stale)} of the {len(changed)} tensors the trainer changed kept their checksum on the server: {shown}"
        f"{' ...' if len(by_served) > 5 else ''}"
    )


ADVICE = {
    "checksums": "It did not load them (a loader that skips a name, a server or one of its ranks restarted mid-push, a "
    "weights.weight_update_urls list that misses it).",
    "probe": "A weight it did not load, an adapter it did not take, or a restarted server. If the probe's gap is only "
    "numerics (a bf16 sampler), set verify.tolerance a few times rollout/logprob_diff_mean.",
}


def verdict(
    error: type[ServerError], url: str, version: int | str | None, findings: dict[str, str | None]
) -> ServerError | None:
    """One error naming ``url`` with every check that failed ({check: finding}), or None when none did."""
    failed = {check: finding for check, finding in findings.items() if finding}
    if not failed:
        return None
    return error(
        f"{error.engine} server at {url} does not hold the weights just pushed"
        f"{f' (version {version})' if version is not None else ''}: {'; '.join(failed.values())}. "
        + " ".join(ADVICE[check] for check in failed)
    )
