"""One prompt's samples from one server: the engine's answers stamped with the weight version that sampled them, and
(partial rollouts) a response interrupted by a weight push finished with the new weights.

Partial rollouts: a push that aborts the requests in flight ends them with finish ``abort`` and the tokens sampled so
far. Each such response is continued with the new weights (the prompt + the tokens so far, the remaining
``max_new_tokens``), and every token keeps the version that sampled it, with its log-prob under that version. Asked
for routes, a continued response's are the concatenation: the first part's, then the continuation's from the first
part's last token (the first token the continuation feeds that the first part did not).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from .samples import Answer, Request, Sample

if TYPE_CHECKING:
    from .engine import Engine


def sample(
    engine: Engine,
    url: str,
    request: Request,
    version: int,
    adapter: str | None = None,
    partial: bool = False,
    check_version: bool = True,
) -> list[Sample]:
    """The ``request.n`` samples of one prompt; aborted requests are sent again (they count as retries), or with
    ``partial`` continued from where they stopped.

    ``version``: the trainer's weight version when the request is sent. With ``check_version`` every answer must
    come from that version or a later one (a server that missed an update fails loudly); a server that reports no
    number (an adapter load does not change it) is taken to hold ``version``.
    ``adapter``: the LoRA adapter to sample with (a server that does not hold it refuses the request).
    """
    with engine.client.gate.sampling():  # never while a push of several requests is half done
        answers = engine.generate(url, request, adapter, keep_aborted=partial)
    samples = [_stamp(engine, url, answer, version, check_version) for answer in answers]
    if partial:
        samples = [_continue(engine, url, request, s, adapter, check_version) for s in samples]
    return samples


def _continue(
    engine: Engine, url: str, request: Request, sample_: Sample, adapter: str | None, check_version: bool
) -> Sample:
    """A response interrupted by a weight push, finished with the weights now served."""
    stalls = 0
    while sample_.finish == "abort":
        remaining = request.max_new_tokens - len(sample_.ids)
        if remaining <= 0:
            return sample_._replace(finish="length")
        routes_from = request.routes_from
        if routes_from is not None and sample_.ids:  # from the first part's last token, its first not fed
            routes_from = len(request.input_ids) + len(sample_.ids) - 1
        more = replace(
            request, input_ids=request.input_ids + sample_.ids, n=1, max_new_tokens=remaining, routes_from=routes_from
        )
        with engine.client.gate.sampling():
            (answer,) = engine.generate(url, more, adapter, keep_aborted=True)
        part = _stamp(engine, url, answer, max(sample_.versions, default=0), check_version)
        stalls = 0 if part.ids else stalls + 1
        if stalls > engine.client.max_retries:
            raise engine.client.fail(
                url, f": a partial response was aborted {stalls} times in a row without a new token"
            )
        support = None if sample_.support is None or part.support is None else sample_.support + part.support
        routes = None  # unknown for the whole sample as soon as one part's are
        if not sample_.ids or not part.ids:
            routes = part.routes if not sample_.ids else sample_.routes
        elif sample_.routes is not None and part.routes is not None:
            routes = np.concatenate([sample_.routes, part.routes])
        sample_ = Sample(
            sample_.ids + part.ids,
            sample_.logprobs + part.logprobs,
            part.finish,
            sample_.versions + part.versions,
            support,
            routes,
        )
    return sample_


def _stamp(engine: Engine, url: str, answer: Answer, version: int, check_version: bool) -> Sample:
    served = answer.weight_version
    number = (
        None if served is None else int(served) if str(served).isdigit() else 0
    )  # 0: a server still on its launch weights ("default")
    if check_version and version and number is not None and number < version:
        raise engine.client.fail(
            url,
            f" sampled with weight_version {served!r} but the trainer pushed {version}: "
            "it missed a weight update (restarted, or not listed in weights.weight_update_urls)",
        )
    stamp = number if number is not None and check_version else version
    return Sample(answer.ids, answer.logprobs, answer.finish, [stamp] * len(answer.ids), answer.support, answer.routes)
