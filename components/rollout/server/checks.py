"""`Checks`: both checks of a push, every ``verify_every`` pushes: exact (the servers' checksums before and after it,
`verify`) and numeric (the probe, `probe`). A server fails with one error naming it and every check that failed.

Under torch.distributed the checksums are read on rank 0 and the probe's continuations scored on every rank (a
collective under FSDP2); every rank returns the same failure.
"""

from __future__ import annotations

import torch
from torch import nn

from .engine import Engine
from .http import ServerError
from .probe import Probe, check_version, probe_finding, server_continuation, trainer_scores
from .ranks import agree, rank, share
from .settings import Verification
from .verify import Checksums, checksum_finding, verdict


class Checks:
    """``tokenizer`` (set at the rollout's setup) builds the probe at the first check."""

    def __init__(self, verification: Verification):
        self.verification = verification
        self.tokenizer = None
        self._probe: Probe | None = None

    def before(self, engine: Engine, urls: list[str]) -> dict[str, Checksums]:
        """Every server's checksums, read before a push."""
        return {url: engine.checksums(url) for url in urls}

    def probe_for(self, policy: nn.Module) -> Probe:
        if self._probe is None:
            self._probe = Probe.for_policy(policy, self.tokenizer)
        return self._probe

    def after_push(
        self,
        engine: Engine,
        policy: nn.Module,
        version: int | None,
        urls: list[str],
        before: dict | None,
        changed: list[str] | None,
        adapter: str | None,
    ) -> BaseException | None:
        """Both checks of every server: its checksums (rank 0), then the probe: each server continues it, the trainer
        scores every continuation (on every rank); the failure, or None."""
        stale, failure = {}, None
        if rank() == 0 and before is not None and changed is not None:
            try:
                stale = self._checksums(engine, urls, before, changed)
            except ServerError as err:
                failure = err
        failure = agree(failure, engine.client.error)
        if failure is not None:
            return failure
        stale = share(stale)
        probe = self.probe_for(policy)
        probes: list | BaseException = []
        if rank() == 0:
            try:
                probes = [server_continuation(engine, url, probe, adapter) for url in urls]
            except ServerError as err:
                probes = err
        probes = share(probes)  # the continuations every rank scores
        if isinstance(probes, BaseException):
            return probes if rank() == 0 else engine.client.error(str(probes))
        expected = trainer_scores(policy, probe.prompt, [ids for ids, _, _ in probes], probe.image_inputs)  # (S, R)
        served = [(url, scores, served_version) for url, (_, scores, served_version) in zip(urls, probes)]
        return self._judge(engine.client.error, served, expected, stale, version)

    def _checksums(self, engine: Engine, urls: list[str], before: dict, changed: list[str]) -> dict[str, str | None]:
        """{url: what its checksums say is missing}; the engine's error when they cannot be read or matched."""
        error, where = engine.client.error, f"{type(engine).__module__}.{type(engine).__qualname__}"
        return {url: checksum_finding(error, url, changed, before[url], engine.checksums(url), engine.fusions, where)
                for url in urls}  # fmt: skip

    def _judge(self, error: type[ServerError], served: list, expected, stale: dict, version) -> BaseException | None:
        """The failure of the first server whose version, checksums or probe is wrong, or None."""
        try:
            for (url, scores, served_version), mine in zip(served, expected):
                check_version(error, url, served_version, None if version is None else str(version))
                findings = {
                    "checksums": stale.get(url),
                    "probe": probe_finding(scores, mine, self.verification.tolerance),
                }
                failure = verdict(error, url, version, findings)
                if failure is not None:
                    return failure
        except ServerError as err:
            return err
        return None

    def after_staged(self, engine: Engine, probe: Probe, continuation, expected, version: int, urls, before, changed,
                     adapter: str | None):  # fmt: skip
        """A staged push (one process): its checksums, and every server scores the trainer's continuation, written
        when the push was staged."""
        try:
            stale = self._checksums(engine, urls, before, changed) if before is not None else {}
            served = []
            for url in urls:
                scored = engine.score(url, probe.prompt, continuation, probe.image_data, adapter)
                served.append((url, torch.tensor(scored.logprobs), scored.weight_version))
        except ServerError as err:
            return err
        return self._judge(engine.client.error, served, [expected] * len(urls), stale, version)
