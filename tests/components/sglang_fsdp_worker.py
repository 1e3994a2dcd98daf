"""One rank of a 2-process gloo group pushing an FSDP2-sharded policy to a loopback SGLang server with
``weight_sync: distributed`` (spawned by test_sglang_weight_sync; kept apart so the spawned processes import little)."""

from __future__ import annotations

import hashlib
import os

import torch

from components.rollout.server.settings import Servers, Verification, WeightPush


def fsdp_push_worker(rank: int, world: int, port: int, model_path: str, url: str, bucket_mb: float, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import components.rollout.server.buckets as buckets
    from components.rollout import SGLangRollout
    from lightning_rl.core.models import ModelSpec, load_causal_lm, load_tokenizer
    from lightning_rl.distributed import shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    policy = load_causal_lm(ModelSpec(path=model_path))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))  # the same on every rank
    from tests.fixtures.sglang_server import _server_name

    expected = {  # as the server names them (a mixture of experts' experts: SGLang's fused names)
        _server_name(n): hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy()).hexdigest()[:16]
        for n, t in policy.state_dict().items()
    }
    shard(policy, init_device_mesh("cpu", (world,)))
    sharded = all(type(p).__name__ == "DTensor" for p in policy.parameters())
    gathered: list[int] = []  # bytes of full tensors per gather: one bucket at a time

    def recording(state, bucket, policy=None):
        tensors = gather(state, bucket, policy)
        gathered.append(sum(t.numel() * t.element_size() for t in tensors))
        return tensors

    gather, buckets.gather = buckets.gather, recording
    rollout = SGLangRollout(
        servers=Servers(urls=(url,), backoff=0.01),
        weights=WeightPush(weight_sync="distributed", bucket_mb=bucket_mb),
        verify=Verification(every=1),
    )
    rollout.setup(load_tokenizer(model_path))
    rollout.sync_weights(policy)  # every rank gathers each bucket; rank 0 broadcasts it; all verify
    rollout.close()
    if rank == 0:
        torch.save(
            {"expected": expected, "gathered": gathered, "sharded": sharded, "version": rollout.weight_version}, out
        )
    dist.destroy_process_group()
