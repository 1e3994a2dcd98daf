"""Waiting for the requests of one rollout, spread over the servers: every answer or the first failure, a progress
line while it is slow, and a deadline."""

from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from typing import Any, Callable

from .http import ServerError

log = logging.getLogger(__name__)


def wait_for_answers(
    futures: list[Future],
    deadline_s: float,
    progress_every_s: float,
    urls: list[str],
    error: type[ServerError],
    watch: Callable[[], None] | None = None,
) -> list[Any]:
    """Every future's result, in order; the first failure is raised at once.

    While requests are outstanding, a progress line (answered / pending, seconds waited) is logged every
    ``progress_every_s``; past ``deadline_s`` the wait ends with ``error`` (a stopped or hung server otherwise means
    silence for up to ``(max_retries + 1) * timeout_s`` per request). ``watch`` is called every second or so while
    requests are outstanding; what it raises ends the wait (a server found dead: `healing.Healing.watch`).
    """
    try:
        start = time.monotonic()
        logged = start
        pending = set(futures)
        while pending:
            waited = time.monotonic() - start
            if waited >= deadline_s:
                raise error(
                    f"{error.engine} rollout: {len(futures) - len(pending)}/{len(futures)} requests answered within "
                    f"deadline_s={deadline_s:g} s (model.rollout.init_args.servers.deadline_s) from {', '.join(urls)}. "
                    "A server may be stalled (stopped process, hung GPU, overloaded): check its log and health, or "
                    "raise servers.deadline_s for very long generations."
                )
            tick = min(progress_every_s, deadline_s - waited, 1.0 if watch is not None else progress_every_s)
            done, pending = wait(pending, timeout=tick, return_when=FIRST_EXCEPTION)
            for f in done:
                if f.exception() is not None:
                    raise f.exception()
            if pending and watch is not None:
                watch()
            if pending and time.monotonic() - logged >= progress_every_s:
                logged = time.monotonic()
                log.warning(
                    "%s rollout: waiting %.0f s for %s: %d/%d requests answered, %d pending (deadline_s=%g)",
                    error.engine,
                    time.monotonic() - start,
                    ", ".join(urls),
                    len(futures) - len(pending),
                    len(futures),
                    len(pending),
                    deadline_s,
                )
        return [f.result() for f in futures]
    except BaseException:  # a failure, the deadline, or an interrupt: no request is left to run
        for f in futures:
            f.cancel()
        raise
