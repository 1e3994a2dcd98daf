"""`RolloutWriter`: recorded iterations written on a thread of their own, so the loop never waits for the disk.

The loop hands over an iteration (its tensors where they are, on the GPU or not) and goes on; the thread copies them
to the host, encodes them (lightning_rl.rollouts.columns) and writes the file. At most ``max_pending`` iterations wait
to be written: past that the loop waits for the oldest (the disk is slower than training, and memory is not
unbounded). A write that failed is raised on the loop's thread at the next hand-over or at `flush`, naming the record.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from lightning_rl.rollouts.iteration import RecordedIteration, write_iteration
from lightning_rl.rollouts.record import library_version, prune


class RolloutWriter:
    """Writes each `RecordedIteration` into ``folder``; ``keep_last`` (None = all) bounds the iterations kept."""

    def __init__(self, folder: Path, keep_last: int | None = None, max_pending: int = 2, prunes: bool = True):
        """``prunes``: this writer removes the iterations past ``keep_last`` (rank 0's writer; the others only write)."""
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"record_rollouts.keep_last={keep_last} must be >= 1 (or null to keep every iteration)")
        self.folder, self.keep_last, self.max_pending, self.prunes = Path(folder), keep_last, max_pending, prunes
        self.folder.mkdir(parents=True, exist_ok=True)
        self._version = library_version()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rollout-record")
        self._pending: deque[tuple[int, Future]] = deque()

    def submit(self, record: RecordedIteration) -> None:
        """Queue ``record`` for writing (waits only while ``max_pending`` are queued); raises an earlier failure."""
        while self._pending and (self._pending[0][1].done() or len(self._pending) >= self.max_pending):
            self._settle(*self._pending.popleft())
        self._pending.append((record.iteration, self._pool.submit(self._write, record)))

    def flush(self) -> None:
        """Wait until every queued iteration is written; raises the first failure."""
        while self._pending:
            self._settle(*self._pending.popleft())

    def close(self) -> None:
        """Flush, then stop the thread (also after a failure: the thread never outlives the writer)."""
        try:
            self.flush()
        finally:
            self._pending.clear()
            self._pool.shutdown(wait=True)

    def _write(self, record: RecordedIteration) -> None:
        write_iteration(record, self.folder, self._version)
        if self.keep_last is not None and self.prunes:
            prune(self.folder, self.keep_last)

    def _settle(self, iteration: int, future: Future) -> None:
        error = future.exception()
        if error is not None:
            raise RuntimeError(
                f"recording the rollouts of iteration {iteration} into {self.folder} failed: {error} "
                "(record_rollouts: false trains without the record)"
            ) from error
