"""The queues: one per training client (its requests run in the order of their ``seq_id``, as the SDK numbers them)
and one per sampler, all served by one worker thread that takes the clients in turn, so no client waits behind
another's whole backlog. A sampler's queued requests with the same settings run together (one ``generate`` call).

A client that dies leaves at most a gap in its own queue: the worker only ever takes requests that are ready, so the
other clients go on; the dead client's session times out and its queue is dropped. A gap in a live client's numbers (a
request the service refused, which the SDK numbered all the same) is closed: at once when the refusal knew the number
(`Scheduler.skip`), else once the later requests have waited ``gap_s`` for it (a body refused unread: too large).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

from lightning_rl.service.errors import BadRequest, Busy, ServiceError
from lightning_rl.service.futures import Answer, Pending

log = logging.getLogger(__name__)

Runner = Callable[[list[Any]], list[Answer]]
"""Runs a batch of jobs' payloads on the worker thread and returns one `Answer` per payload, in order."""


@dataclass
class Job:
    future: Pending
    payload: Any
    runner: Runner
    seq_id: int | None = None
    batch_key: Hashable | None = None
    """Jobs of one queue with the same (not None) key and runner may run in one call."""


@dataclass
class ClientQueue:
    """One client's queue. ``ordered``: jobs run by ``seq_id``, each when the one before it has been taken."""

    key: str
    tenant: str
    session_id: str
    ordered: bool
    next_seq: int = 1
    waiting: dict[int, Job] = field(default_factory=dict)  # ordered: seq_id -> job
    fifo: list[Job] = field(default_factory=list)  # unordered
    seen: "OrderedDict[int, str]" = field(default_factory=OrderedDict)  # seq_id -> request id, for resent requests
    running: int = 0
    skipped: set[int] = field(default_factory=set)  # seq_ids refused: never coming
    gap_since: float | None = None  # when the next seq_id was first missing while later ones waited

    @property
    def depth(self) -> int:
        """Requests accepted and not finished (waiting, and the one running)."""
        return len(self.waiting) + len(self.fifo) + self.running

    def ready(self, max_batch: int, now: float = 0.0, gap_s: float = float("inf")) -> list[Job]:
        if self.ordered:
            while self.next_seq in self.skipped:
                self.skipped.discard(self.next_seq)
                self.next_seq += 1
            job = self.waiting.pop(self.next_seq, None)
            if job is None:
                if not self.waiting:
                    self.gap_since = None
                    return []
                self.gap_since = now if self.gap_since is None else self.gap_since
                if now - self.gap_since < gap_s:
                    return []
                log.warning(
                    "%s: seq_id %d never came (a request refused before its number was read); going on with %d",
                    self.key, self.next_seq, min(self.waiting),
                )  # fmt: skip
                self.next_seq = min(self.waiting)
                job = self.waiting.pop(self.next_seq)
            self.gap_since = None
            self.next_seq += 1
            return [job]
        if not self.fifo:
            return []
        first = self.fifo.pop(0)
        batch = [first]
        if first.batch_key is not None:
            rest = []
            for job in self.fifo:
                if len(batch) < max_batch and job.batch_key == first.batch_key and job.runner == first.runner:
                    batch.append(job)
                else:
                    rest.append(job)
            self.fifo = rest
        return batch


class Scheduler:
    """The worker thread and every client's queue."""

    def __init__(self, max_queued: int, max_batch: int = 512, gap_s: float = 5.0):
        self.max_queued, self.max_batch, self.gap_s = max_queued, max_batch, gap_s
        self._cond = threading.Condition()
        self._queues: OrderedDict[str, ClientQueue] = OrderedDict()
        self._stopped = False
        self._thread = threading.Thread(target=self._work, name="tinker-service-worker", daemon=True)
        self._thread.start()

    def open(self, key: str, tenant: str, session_id: str, ordered: bool, next_seq: int = 1) -> None:
        with self._cond:
            if key not in self._queues:
                self._queues[key] = ClientQueue(key, tenant, session_id, ordered, next_seq)

    def submit(self, key: str, job: Job) -> str:
        """Queue ``job``; returns its request id, or that of the request already queued under the same ``seq_id``
        (the SDK resends a request whose answer it lost)."""
        with self._cond:
            queue = self._queues[key]
            if job.seq_id is not None and job.seq_id in queue.seen:
                return queue.seen[job.seq_id]
            if queue.ordered:
                if job.seq_id is None or job.seq_id < queue.next_seq:
                    raise BadRequest(
                        f"seq_id {job.seq_id} of {key} was already taken (the next is {queue.next_seq}); a client numbers "
                        "its requests 1, 2, ... after create_model",
                        "seq_id",
                    )
            if queue.depth >= self.max_queued:
                raise Busy(
                    f"{key} has {queue.depth} requests queued (serve limits.max_queued_per_client): wait for some to finish",
                    "seq_id",
                )
            if queue.ordered:
                queue.waiting[job.seq_id] = job
            else:
                queue.fifo.append(job)
            if job.seq_id is not None:
                queue.seen[job.seq_id] = job.future.request_id
                while len(queue.seen) > 4 * self.max_queued:
                    queue.seen.popitem(last=False)
            self._cond.notify()
            return job.future.request_id

    def skip(self, key: str, seq_id: int | None) -> None:
        """``seq_id`` of ``key`` was refused: it will not come, and the requests after it need not wait for it."""
        with self._cond:
            queue = self._queues.get(key)
            if queue is None or not queue.ordered or seq_id is None or seq_id < queue.next_seq:
                return
            if seq_id not in queue.waiting and seq_id not in queue.seen:
                queue.skipped.add(seq_id)
                self._cond.notify()

    def next_free(self, key: str) -> int:
        """The seq_id after every one queued: for a call that comes without one (a client other than the SDK)."""
        with self._cond:
            queue = self._queues[key]
            return max([queue.next_seq - 1, *queue.waiting, *queue.seen]) + 1

    def close(self, key: str, reason: str) -> None:
        """Drop a client's queue: its waiting requests fail with ``reason`` (one running finishes)."""
        with self._cond:
            queue = self._queues.pop(key, None)
        if queue is not None:
            for job in [*queue.waiting.values(), *queue.fifo]:
                job.future.fail(reason)

    def close_session(self, session_id: str, reason: str) -> None:
        with self._cond:
            keys = [k for k, q in self._queues.items() if q.session_id == session_id]
        for key in keys:
            self.close(key, reason)

    def depths(self, tenant: str) -> dict[str, int]:
        with self._cond:
            return {k: q.depth for k, q in self._queues.items() if q.tenant == tenant}

    def depth(self, key: str) -> int:
        with self._cond:
            queue = self._queues.get(key)
            return 0 if queue is None else queue.depth

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def _next(self) -> tuple[ClientQueue, list[Job]] | None:
        now = time.monotonic()
        for key in list(self._queues):  # round robin: a queue that ran goes to the back
            queue = self._queues[key]
            jobs = queue.ready(self.max_batch, now, self.gap_s)
            if jobs:
                self._queues.move_to_end(key)
                queue.running += len(jobs)
                return queue, jobs
        return None

    def _work(self) -> None:
        while True:
            with self._cond:
                picked = self._next()
                while picked is None and not self._stopped:
                    gapped = any(q.gap_since is not None for q in self._queues.values())
                    self._cond.wait(timeout=min(0.5, self.gap_s) if gapped else None)  # a gap closes with time
                    picked = self._next()
                if picked is None:
                    return
            queue, jobs = picked
            try:
                _run(jobs)
            finally:
                with self._cond:
                    queue.running -= len(jobs)
                    self._cond.notify_all()


def _run(jobs: list[Job]) -> None:
    try:
        answers = jobs[0].runner([job.payload for job in jobs])
    except ServiceError as err:  # a request found wrong while it ran: the client's mistake
        for job in jobs:
            job.future.fail(err.message, "user")
        return
    except Exception as err:  # noqa: BLE001 (the worker must outlive any one request)
        log.error("a %s request failed:\n%s", jobs[0].future.kind, traceback.format_exc())
        for job in jobs:
            job.future.fail(f"{type(err).__name__}: {err}", "server")
        return
    for job, answer in zip(jobs, answers):
        job.future.resolve(answer)
