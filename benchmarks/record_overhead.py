"""What recording the rollouts (``record_rollouts: true``, lightning_rl.rollouts) costs the default job: seconds per
RL iteration with the record on against off, and the disk the record takes per 1,000 samples.

    python benchmarks/record_overhead.py                        # 3 pairs x 100 iterations, off / on alternated
    python benchmarks/record_overhead.py --iterations 200 --pairs 2
    python benchmarks/record_overhead.py --config configs/ppo_rlhf.yaml --set model.reward.init_args.path=...

Each run is the default job (configs/grpo.yaml as shipped: the tiny policy, 16 prompts x 8 samples, 8 new tokens) in
a fresh process, without validation (it samples, and would dominate), with its checkpoints and TensorBoard logs as
the job writes them; the variants alternate off, on, off, on, ... with the same seed. An iteration's time runs from
the end of one training step to the end of the next, so everything between them counts (the writer's thread competing
for the cores, Lightning's loop, the logging); the first ``--warmup`` iterations are left out. The record's share of
the loop's own thread (``time/record_s``: the random state, the weights' checksum, the hand-over) is printed too.

Last lines: ``record on / off, seconds per iteration: <ratio> (recording costs <+x.x>% of an iteration)`` (total time
of the on runs over the off runs) and ``disk per 1,000 samples: <KiB>``. On a shared machine the timings are skewed:
the script prints the load average before and after; quote the ratio from a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import emit, load_note, run_worker  # noqa: E402


def worker(args: argparse.Namespace) -> None:
    from lightning_rl.cli import main
    from lightning_rl.loop.module import RLModule
    from lightning_rl.loop.recording import IterationRecorder
    from lightning_rl.rollouts import Record

    ends: list[float] = []
    loop_share: list[float] = []
    training_step, trained = RLModule.training_step, IterationRecorder.trained

    def timed_step(self, dataloader_iter):
        out = training_step(self, dataloader_iter)
        ends.append(time.perf_counter())
        return out

    def timed_record(self, *a, **k):
        start = time.perf_counter()
        trained(self, *a, **k)
        loop_share.append(time.perf_counter() - start)

    RLModule.training_step, IterationRecorder.trained = timed_step, timed_record
    with tempfile.TemporaryDirectory() as tmp:
        main(
            [
                "fit",
                "--config",
                str(ROOT / args.config),
                *[f"--{s}" for s in args.set],
                f"--record_rollouts={'true' if args.worker == 'on' else 'false'}",
                f"--seed_everything={args.seed}",
                f"--trainer.max_steps={args.iterations + args.warmup}",
                "--trainer.limit_val_batches=0",
                "--trainer.enable_progress_bar=false",
                "--trainer.accelerator=cpu",
                f"--trainer.default_root_dir={tmp}",
                f"--trainer.logger.init_args.save_dir={tmp}",
                f"--trainer.callbacks.init_args.dirpath={tmp}/bench/checkpoints",
                "--model.loop.log_samples_every_n_steps=0",
            ]
        )
        seconds = [b - a for a, b in zip(ends[args.warmup :], ends[args.warmup + 1 :])]
        disk = samples = 0
        if args.worker == "on":
            (folder,) = Path(tmp).rglob("rollouts")
            record = Record(folder)
            files = [record.path(i) for i in record.iterations]
            disk = sum(p.stat().st_size for p in files)
            samples = sum(len(record.read(i).batch.scores) for i in record.iterations)
    emit(
        {
            "seconds": seconds,
            "record_s": statistics.mean(loop_share) if loop_share else 0.0,
            "disk": disk,
            "samples": samples,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/grpo.yaml")
    parser.add_argument("--iterations", type=int, default=100, help="timed iterations per run (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=3, help="off / on pairs, alternated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], help="a config override, e.g. data.batch_size=32")
    parser.add_argument("--worker", choices=["off", "on"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    print(f"before: {load_note()}")
    passed = ["--config", args.config, "--iterations", str(args.iterations), "--warmup", str(args.warmup)]
    passed += ["--seed", str(args.seed), *[a for s in args.set for a in ("--set", s)]]
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for pair in range(args.pairs):
        for variant in ("off", "on"):
            result = run_worker(Path(__file__), [*passed, "--worker", variant])
            runs[variant].append(result)
            mean, median = statistics.mean(result["seconds"]), statistics.median(result["seconds"])
            print(
                f"pair {pair + 1} record {variant:3s}: {1000 * mean:7.1f} ms / iteration (median {1000 * median:.1f})"
                + (f", the loop's share of recording {1000 * result['record_s']:.2f} ms" if variant == "on" else ""),
                flush=True,
            )
    total = {variant: sum(sum(r["seconds"]) for r in results) for variant, results in runs.items()}
    medians = {
        variant: statistics.median(s for r in results for s in r["seconds"]) for variant, results in runs.items()
    }
    on = runs["on"][-1]
    print(f"after: {load_note()}")
    print(f"iterations timed: {args.pairs} x {args.iterations} per variant, {args.config}")
    print(f"medians per iteration: off {1000 * medians['off']:.1f} ms, on {1000 * medians['on']:.1f} ms")
    ratio = total["on"] / total["off"]
    print(
        f"record on / off, seconds per iteration: {ratio:.3f} (recording costs {100 * (ratio - 1):+.1f}% of an iteration)"
    )
    print(
        f"disk per 1,000 samples: {on['disk'] / on['samples'] * 1000 / 1024:.1f} KiB ({on['samples']} samples recorded)"
    )


if __name__ == "__main__":
    main()
