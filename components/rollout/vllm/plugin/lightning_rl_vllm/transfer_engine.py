"""The worker side of lightning_rl's weight transfer: a private torch process group with the trainer (rank 0, which
hosts the group's TCP store), gloo on CPU and nccl on GPUs; each ``/update_weights`` receives one bucket as a single
uint8 broadcast (every tensor's bytes back to back, in the order named) and loads it with ``model.load_weights``
under checkpoint names (vLLM's loader fuses q/k/v and gate/up).

``/init_weight_transfer_engine {"init_info": {master_address, master_port, world_size, rank_offset, timeout_s,
backend}}``; ``/start_weight_update`` begins a layerwise reload; ``/update_weights {"update_info": {names,
dtype_names, shapes}}`` per bucket; ``/finish_weight_update`` finalises it. Mirrors vLLM 0.32's NCCL engine
(``vllm/distributed/weight_transfer/nccl_engine.py``), whose trainer side needs vLLM importable in the trainer's
environment; this one needs torch only there.
"""

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import BroadcastOptions, PrefixStore, TCPStore
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.logger import init_logger

logger = init_logger(__name__)

STORE_PREFIX = "lightning_rl-weights"  # the trainer's side uses the same prefix


@dataclass
class GroupInitInfo(WeightTransferInitInfo):
    master_address: str
    master_port: int
    world_size: int = 2
    rank_offset: int = 1
    timeout_s: float = 300.0
    backend: str = "gloo"


@dataclass
class BucketInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"names, dtype_names and shapes differ in length: {len(self.names)}, {len(self.dtype_names)}, "
                f"{len(self.shapes)}"
            )


def make_group(backend: str, address: str, port: int, rank: int, world_size: int, timeout_s: float):
    """A process group of its own, apart from the worker's default group (vLLM's)."""
    timeout = timedelta(seconds=timeout_s)
    store = PrefixStore(
        STORE_PREFIX,
        TCPStore(address, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False),
    )
    if backend == "nccl":
        from torch.distributed import ProcessGroupNCCL

        options = ProcessGroupNCCL.Options()
        options._timeout = timeout
        return ProcessGroupNCCL(store, rank, world_size, options)
    from torch.distributed import ProcessGroupGloo

    options = ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [ProcessGroupGloo.create_device(hostname=address)]
    return ProcessGroupGloo(store, rank, world_size, options)


class TorchGroupWeightTransferEngine(WeightTransferEngine[GroupInitInfo, BucketInfo]):
    init_info_cls = GroupInitInfo
    update_info_cls = BucketInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group = None
        self.backend = "gloo"

    def init_transfer_engine(self, init_info: GroupInitInfo) -> None:
        pc = self.parallel_config
        rank = pc.data_parallel_index * pc.world_size + pc.rank + init_info.rank_offset
        self.backend = init_info.backend
        self.group = make_group(
            init_info.backend, init_info.master_address, init_info.master_port, rank, init_info.world_size,
            init_info.timeout_s,
        )  # fmt: skip
        logger.info("lightning_rl weight transfer: rank %d of %d (%s)", rank, init_info.world_size, init_info.backend)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class ends with torch.accelerator.synchronize(), which raises where there is no accelerator
        self.receive_weights(self.parse_update_info(update_info))
        if self.backend == "nccl":
            torch.cuda.synchronize()

    def receive_weights(self, update_info: BucketInfo) -> None:
        if self.group is None:
            raise RuntimeError("lightning_rl weight transfer: POST /init_weight_transfer_engine first")
        dtypes = [getattr(torch, name) for name in update_info.dtype_names]
        sizes = [torch.Size(s).numel() * d.itemsize for s, d in zip(update_info.shapes, dtypes)]
        device = "cuda" if self.backend == "nccl" else "cpu"
        buffer = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
        options = BroadcastOptions()
        options.rootRank, options.rootTensor = 0, 0
        self.group.broadcast([buffer], options).wait()
        weights, offset = [], 0
        for name, dtype, shape, size in zip(update_info.names, dtypes, update_info.shapes, sizes):
            weights.append((name, buffer[offset : offset + size].view(dtype).view(shape)))
            offset += size
        self.model.load_weights(weights)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        self._keep_partly_pushed_experts()
        finalize_layerwise_reload(self.model, self.model_config)
        self._repack_tied_lm_head()

    def _keep_partly_pushed_experts(self) -> None:
        """A mixture-of-experts layer the push carried only part of keeps the weights it held. vLLM's layerwise reload
        would build the layer anew from the parts it received and leave the rest uninitialised memory (its delayed
        processing, meant for padding), whose checksum moves like a loaded tensor's: kept, a tensor the push missed
        keeps its checksum and the trainer's verification names it (and the next push sends the layer whole)."""
        from vllm.model_executor.model_loader.reload import layerwise

        for name, layer in self.model.named_modules():
            info = layerwise.LAYERWISE_INFO.get(layer)
            if not (hasattr(layer, "w13_weight") and hasattr(layer, "w2_weight")) or info is None:
                continue
            if info.can_load() and info.kernel_tensors is not None and 0 < info.load_numel < info.load_numel_total:
                logger.warning(
                    "lightning_rl weight transfer: %s received %d of its %d elements; it keeps the weights it held",
                    name, info.load_numel, info.load_numel_total,
                )  # fmt: skip
                layerwise._place_kernel_tensors(layer, info)
                info.reset()

    def _repack_tied_lm_head(self) -> None:
        """vLLM's layerwise reload never processes a tied ParallelLMHead again, so on the CPU build its packed oneDNN
        copy of the old embedding would keep producing the logits (without ``LIGHTNING_RL_VLLM_PLAIN_LINEAR``)."""
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        for module in self.model.modules():
            if isinstance(module, ParallelLMHead) and hasattr(module, "cpu_linear") and module.weight.numel() > 0:
                dispatch_cpu_unquantized_gemm(module, remove_weight=False)

    def shutdown(self) -> None:
        self.group = None
