"""Where vLLM's own environment is: vLLM pins its torch and transformers, so it never shares the trainer's.

The interpreter is, in this order: the rollout's ``servers.launch_python``, the ``LIGHTNING_RL_VLLM_PYTHON`` environment
variable, or ``.venv-vllm/bin/python`` in the repository, which ``make vllm-env`` (and ``make test``) creates.
"""

from __future__ import annotations

import os
from pathlib import Path

VARIABLE = "LIGHTNING_RL_VLLM_PYTHON"
MADE = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
"""Where ``make vllm-env`` puts vLLM's interpreter."""


def vllm_python(launch_python: str | None = None) -> str:
    """The interpreter that has vLLM, or a one-line error naming the three places it may come from."""
    given = launch_python or os.environ.get(VARIABLE)
    candidate = Path(given) if given else MADE
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    raise FileNotFoundError(
        f"no vLLM environment at {candidate}: set servers.launch_python (of model.rollout.init_args, or "
        f"model.teacher.init_args for a vLLM teacher) or {VARIABLE} to the python of an environment with vllm installed, "
        f"or run `make vllm-env` (it creates {MADE})"
    )
