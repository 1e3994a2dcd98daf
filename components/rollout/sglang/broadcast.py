"""``weight_sync: distributed`` as `SGLangRollout` runs it: a push through the `WeightGroup`, with no sample ever taken
from a partly updated server.

SGLang loads each bucket as it arrives and frees its ``model_update_lock`` between two requests, so around the
buckets a push (on rank 0):

1. closes the client's `SamplingGate` (our new requests wait) and pauses every server (``/pause_generation``):
   with partial rollouts in asynchronous training in mode ``abort`` (the requests in flight end now and continue
   with the new weights), otherwise once our requests in flight have finished, in mode ``retract``;
2. ``/begin_weight_update``, the buckets (the new ``weight_version`` on the last), ``/end_weight_update``;
3. ``/continue_generation`` and opens the gate.

When a push fails (a server died mid-bucket, refused a bucket), the group is torn down, the servers stay paused
(they may hold part of the push) and the gate fails every request until a push succeeds; the next rollout pushes
the whole policy again, through a new group. Before a push, a server whose ``weight_version`` is not the last one
pushed (restarted, so out of the group) makes the push re-create the group.
"""

from __future__ import annotations

import uuid

from torch import nn

from .buckets import gather, plan_buckets
from .client import SGLangError
from .group import WeightGroup, drain
from .weights import rank, succeeded


class DistributedPush:
    """The distributed-push half of `WeightSync` (its attributes are set by `SGLangRollout`)."""

    _group: WeightGroup | None = None

    def _push_distributed(self, policy: nn.Module, version: str, urls: list[str]) -> None:
        buckets = plan_buckets(policy, int(self.bucket_mb * 2**20))
        state = policy.state_dict(keep_vars=True)
        tensors = (gather(state, bucket) for bucket in buckets)  # every rank gathers each bucket, in order
        if rank() != 0:
            drain(tensors)
            return
        gate, abort = self.client.gate, self.partial_rollouts and self.overlapping
        gate.close()
        try:
            group = self._weight_group(policy, urls)
            if abort:
                self._each(
                    urls, "/pause_generation", {"mode": "abort"}
                )  # our requests in flight end with what they have
            gate.wait_idle()
            if not abort:
                self._each(urls, "/pause_generation", {"mode": "retract"})
            self._each(urls, "/begin_weight_update", {})
            group.push(buckets, tensors, version, self.flush_cache)
            self._each(urls, "/end_weight_update", {})
            self._each(urls, "/continue_generation", {})
        except BaseException as err:
            drain(tensors)
            self._drop_group(end_sessions=True)
            gate.open(failure=f"no sample is taken from a server that may hold part of a failed weight push ({err})")
            raise
        gate.open()

    def _weight_group(self, policy: nn.Module, urls: list[str]) -> WeightGroup:
        if self._group is not None and self._restarted(urls):
            self._drop_group()
        if self._group is None:
            backend = self.group_backend or ("nccl" if next(policy.parameters()).device.type == "cuda" else "gloo")
            name = f"lightning_rl_{uuid.uuid4().hex[:12]}"  # a crashed trainer may have left its group on the servers
            per_server = backend == "gloo" if self.group_per_server is None else self.group_per_server
            self._group = WeightGroup(
                self.client, urls, backend, self.master_address, self.master_port, name, per_server=per_server
            )
        return self._group

    def _restarted(self, urls: list[str]) -> bool:
        """A server that does not report the last version pushed has restarted (or missed it): it is not in the group."""
        for url in urls:
            info = self.client.request(url, "/model_info", method="GET")
            if str((info or {}).get("weight_version")) != str(self.weight_version):
                return True
        return False

    def _drop_group(self, end_sessions: bool = False) -> None:
        if self._group is None:
            return
        group, self._group = self._group, None
        group.close()  # the trainer leaves first: a server still inside a broadcast is released
        if end_sessions:  # a server that lived through a failed push must accept the next /begin_weight_update
            for url in group.urls:
                try:
                    self.client.request(url, "/end_weight_update", {}, retries=0, timeout_s=30.0)
                except SGLangError:
                    pass

    def _each(self, urls: list[str], path: str, body: dict) -> None:
        for url in urls:
            self.client.request(url, path, body, check=succeeded(url), retries=0)
