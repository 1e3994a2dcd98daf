"""`SGLangRollout`: the server rollout on SGLang servers, over SGLang's native HTTP API (`SGLangEngine`).

SGLang pins its own torch and CUDA stack, so it runs out of process: servers already running (``base_url``, or an
SGLang router), or one launched here (``launch``).
"""

from __future__ import annotations

from ..server.rollout import ServerRollout
from .engine import SGLangEngine


class SGLangRollout(ServerRollout):
    """Sample ``group_size`` responses per prompt from SGLang servers; push the policy's weights after every update.

    ``rollout_logprobs`` are the sampler's own: the trainer/sampler mismatch is logged as ``rollout/logprob_diff_*``
    and TIS/MIS can correct for it. With top-k / top-p SGLang reports them before the truncation (log_softmax(z / T)
    over the whole vocabulary), where the trainer's are renormalised over the kept tokens: the module warns.
    """

    engine_type = SGLangEngine
    truncated_logprobs = False

    def __init__(
        self,
        base_url: str | list[str] | None = None,
        launch: dict | None = None,
        launch_python: str | None = None,
        flush_cache: bool = True,
        release_memory: bool = False,
        **kwargs,
    ):
        """
        Args:
            base_url: running server(s) (``http://host:port``) or an SGLang router; prompts are spread over them.
            launch: instead of ``base_url``, start ``python -m sglang.launch_server`` with these arguments
                (``{model_path: ..., mem_fraction_static: 0.5}``; ``True`` = bare flag) and stop it on ``close``.
            launch_python: interpreter that has sglang installed (None = this one).
            flush_cache: ``POST /flush_cache`` after each update (the radix cache holds KV of the old weights).
            release_memory: release the servers' GPU memory between rollouts and resume it before the next
                (colocated training; the server needs ``--enable-memory-saver``).
        """
        super().__init__(
            base_url=base_url,
            launch=launch,
            launch_python=launch_python,
            flush_cache=flush_cache,
            release_memory=release_memory,
            **kwargs,
        )
