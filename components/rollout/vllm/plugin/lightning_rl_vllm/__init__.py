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
    _reload_cpu_experts()
    if os.environ.get("LIGHTNING_RL_VLLM_PLAIN_LINEAR") == "1":
        import vllm._custom_ops as ops

        # read when a layer's GEMM is chosen (model_executor/layers/utils.py): without oneDNN it is F.linear
        ops._supports_onednn = False


def _reload_cpu_experts() -> None:
    """vLLM 0.32's CPU experts pad the intermediate size to a multiple of 32 and prepack the weights on the first load
    only (``UnquantizedFusedMoEMethod._setup_kernel`` skips ``fused_experts.process_weights_after_loading`` on a weight
    update), so an in-place reload of a mixture of experts meets the kernel's padded, prepacked tensors with plain ones
    and fails on their shapes. On a CPU, a weight update pads and prepacks the new weights as the first load did."""
    from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method as method
    from vllm.platforms import current_platform

    cls = method.UnquantizedFusedMoEMethod
    if not current_platform.is_cpu() or getattr(cls._setup_kernel, "lightning_rl", False):
        return
    original = cls._setup_kernel

    def setup_kernel(self, layer, w13, w2):
        update = self.moe_kernel is not None
        original(self, layer, w13, w2)
        if update:
            self.moe_kernel.fused_experts.process_weights_after_loading(layer)

    setup_kernel.lightning_rl = True
    cls._setup_kernel = setup_kernel
