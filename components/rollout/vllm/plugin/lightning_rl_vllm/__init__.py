"""A vLLM general plugin, run inside vLLM's own environment (it imports vllm; lightning_rl never imports it).

vLLM finds it through the entry point ``vllm.general_plugins: lightning_rl`` of the ``*.dist-info`` folder beside this
package: with the folder that holds both on vLLM's ``PYTHONPATH`` (the rollout's ``launch`` puts it there) nothing is
installed into vLLM's environment. vLLM calls `register` in each of its processes (API server, engine core, workers),
possibly more than once.

``register`` adds the weight-transfer engine ``lightning_rl`` (`transfer_engine`; a server selects it with
``--weight-transfer-config '{"backend": "lightning_rl"}'``). With ``LIGHTNING_RL_VLLM_PLAIN_LINEAR=1`` it also keeps
the CPU build's linear layers on ``torch.nn.functional.linear`` over their own weights: by default the CPU build packs
each linear weight for oneDNN and leaves an empty tensor in its place, so ``/weight_checker`` hashes nothing for
q/k/v, o, gate/up and down (a stale one would go unseen), and a tied ``lm_head`` keeps its packed copy of the old
embedding after an in-place weight update.
"""

import os


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if "lightning_rl" not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(
            "lightning_rl", "lightning_rl_vllm.transfer_engine", "TorchGroupWeightTransferEngine"
        )
    if os.environ.get("LIGHTNING_RL_VLLM_PLAIN_LINEAR") == "1":
        import vllm._custom_ops as ops

        # read when a layer's GEMM is chosen (model_executor/layers/utils.py): without oneDNN it is F.linear
        ops._supports_onednn = False
