"""`SGLangRollout`: the server rollout on SGLang servers, over SGLang's native HTTP API (`SGLangEngine`).

SGLang pins its own torch and CUDA stack, so it runs out of process: servers already running (``servers.urls``, or an
SGLang router), or one launched here (``servers.launch``).
"""

from __future__ import annotations

from ..server.rollout import ServerRollout
from .engine import SGLangEngine


class SGLangRollout(ServerRollout):
    """Sample ``group_size`` responses per prompt from SGLang servers; push the policy's weights after every update.

    ``rollout_logprobs`` are the sampler's own: the trainer/sampler mismatch is logged as ``rollout/logprob_diff_*``
    and TIS/MIS can correct for it. With top-k / top-p SGLang reports them before the truncation (log_softmax(z / T)
    over the whole vocabulary), where the trainer's are renormalised over the kept tokens: the module warns.

    SGLang's own settings: ``servers.urls`` may name an SGLang router (list the workers in
    ``weights.weight_update_urls``); ``servers.launch`` starts ``python -m sglang.launch_server`` with its arguments
    (``{model_path: ..., mem_fraction_static: 0.5}``; ``True`` = bare flag) under ``servers.launch_python`` (None = this
    interpreter); ``weights.flush_cache`` is ``POST /flush_cache`` after each update (the radix cache holds KV of the
    old weights); ``weights.release_memory`` needs the server's ``--enable-memory-saver``.
    """

    engine_type = SGLangEngine
    truncated_logprobs = False
