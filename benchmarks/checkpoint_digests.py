"""What the tensor digests (lightning_rl.digests) cost per save and per load: a checkpoint of a random policy of
``--params`` fp32 parameters with its Adam moments (weights + 2 moments: 12 bytes per parameter), written with
`AtomicCheckpointIO` (torch.save into a temporary file, fsync, rename) and read back, with the digests and without.

    python benchmarks/checkpoint_digests.py --params 50_000_000

Prints the seconds of each part (median of ``--repeats``), the hashing throughput, and the share of a save the digests
add (the last line: ``digests add <x> s per save of <n> GB (<y>% of the save)``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import load_note  # noqa: E402
from lightning_rl import checkpoint as checkpoint_module  # noqa: E402
from lightning_rl.checkpoint import AtomicCheckpointIO  # noqa: E402
from lightning_rl.digests import checked, digests  # noqa: E402


def state(params: int, tensors: int = 64) -> dict:
    """Weights and two Adam moments of ``params`` parameters in ``tensors`` tensors each."""
    size = params // tensors
    weights = {f"policy.layers.{i}.weight": torch.randn(size) for i in range(tensors)}
    moments = {i: {"exp_avg": torch.randn(size), "exp_avg_sq": torch.rand(size), "step": torch.tensor(3.0)}
               for i in range(tensors)}  # fmt: skip
    return {"state_dict": weights, "optimizer_states": [{"state": moments}], "global_step": 3}


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=50_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(load_note())
    checkpoint = state(args.params)
    gigabytes = sum(t.numel() * t.element_size() for t in _tensors(checkpoint)) / 1e9
    io = AtomicCheckpointIO()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "last.ckpt"
        with_digests = timed(lambda: io.save_checkpoint(checkpoint, path), args.repeats)
        hashing = timed(lambda: digests(checkpoint), args.repeats)
        loading = timed(lambda: io.load_checkpoint(path), args.repeats)
        plain_load = timed(lambda: checkpoint_module.torch.load(path, weights_only=True), args.repeats)
        loaded = checkpoint_module.torch.load(path, weights_only=True)
        check = timed(lambda: checked(dict(loaded), "benchmark"), args.repeats)
    print(f"checkpoint: {gigabytes:.2f} GB ({args.params:,} parameters, fp32 weights + Adam moments)")
    print(f"save with digests {with_digests:.2f} s, of which hashing {hashing:.2f} s ({gigabytes / hashing:.2f} GB/s)")
    print(f"load with the check {loading:.2f} s (torch.load alone {plain_load:.2f} s, the check {check:.2f} s)")
    print(load_note())
    print(
        f"digests add {hashing:.2f} s per save of {gigabytes:.2f} GB ({100 * hashing / with_digests:.0f}% of the save)"
    )


def _tensors(value):
    from lightning_rl.digests import tensors

    return [t for _, t in tensors(value)]


if __name__ == "__main__":
    main()
