"""The trainer's ranks around a push: rank 0 talks to the servers, every rank takes part in the gathers, and a failure
on any rank fails every rank with the same message (never a rank left waiting at a barrier)."""

from __future__ import annotations

import torch.distributed as dist


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def several_ranks() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def agree(failure: BaseException | None, error: type[Exception]) -> BaseException | None:
    """The first failure of any rank, on every rank (a collective under torch.distributed); another rank's failure is
    raised here as ``error``."""
    if not several_ranks():
        return failure
    messages: list = [None] * dist.get_world_size()
    dist.all_gather_object(messages, None if failure is None else f"{type(failure).__name__}: {failure}")
    if failure is None and any(messages):
        failure = error(next(m for m in messages if m))
    return failure


def share(value, source: int = 0):
    """Rank ``source``'s ``value`` on every rank (itself without torch.distributed)."""
    box = [value]
    if dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(box, src=source)
    return box[0]
