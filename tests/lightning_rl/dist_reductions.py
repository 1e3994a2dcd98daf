"""One rank of a 2-process gloo group running the module's cross-rank reductions (spawned by test_distributed).

Kept apart from dist_probe so that spawned processes import only torch and the reductions.
"""

from __future__ import annotations

import torch


def reductions_worker(rank: int, world: int, port: int, out: str) -> None:
    """One rank of a gloo group: the module's cross-rank reductions on this rank's rows of a fixed batch."""
    import os

    import torch.distributed as dist

    from components.aggregator import SeqMeanTokenMean, SeqMeanTokenSum, TokenMean, TokenSumNorm
    from lightning_rl.core.ops import all_reduce_sum, masked_whiten, world_size
    from lightning_rl.loop.metrics import WeightedMeans

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x, mask = reduction_inputs()
    rows = slice(rank * x.shape[0] // world, (rank + 1) * x.shape[0] // world)  # this rank's samples
    x, mask = x[rows], mask[rows]
    result = {
        "whitened": masked_whiten(x, mask, global_stats=True),
        "whitened_scale_only": masked_whiten(x, mask, shift_mean=False, global_stats=True),
    }
    for aggregator in (TokenMean(), SeqMeanTokenMean(), SeqMeanTokenSum(), TokenSumNorm(4.0)):
        # as RLModule._optimize: the global normaliser, divided by the world size that DDP averages over
        total = all_reduce_sum(aggregator.denominator(mask)) / world_size()
        result[type(aggregator).__name__] = all_reduce_sum(aggregator(x, mask, total)) / world_size()
    metrics = WeightedMeans()
    metrics.add("token_mean", (x * mask).sum() / mask.sum(), mask.sum())
    metrics.add("x_max", (x * mask).max())
    result.update(metrics.compute())
    gathered = [None] * world
    dist.all_gather_object(gathered, result)
    if rank == 0:
        torch.save(gathered, out)
    dist.destroy_process_group()


def reduction_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """A (6, 5) batch of values with ragged response masks (one sample with no valid token)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=g) * 3 + 1
    lengths = torch.tensor([5, 1, 3, 0, 4, 2])
    return x, (torch.arange(5)[None] < lengths[:, None]).float()
