"""On-policy distillation against GRPO from the same student: RL iterations and wall time to 0.9 held-out accuracy.

    python benchmarks/distill_vs_rl.py                     # 3 seeds x {GRPO, distillation, GRPO with more steps (2)}
    python benchmarks/distill_vs_rl.py --seeds 0 --variants grpo distill

Every variant starts from the shipped tiny policy (lightning_rl/assets/tiny-arith, 0.31 held-out greedy accuracy) on
`builtin:arithmetic`, samples 128 responses of at most 8 tokens per iteration at temperature 1, and is validated after
every iteration (greedy exact match on the 500 held-out prompts) until it reaches the target (0.9) or --max-iterations:

* ``grpo``: configs/grpo.yaml as shipped (16 prompts x 8 samples, one on-policy update of lr 1e-4 per iteration);
* ``distill``: configs/distill.yaml as shipped (128 prompts x 1 sample scored by the shipped teacher, the exact
  reverse KL to it at every token, 2 epochs x 4 mini-batches of lr 3e-4 per iteration);
* ``grpo_mb4``, ``grpo_loop``: GRPO with 4 mini-batches (4 optimizer steps per iteration), and with distillation's
  whole update loop (2 epochs x 4 mini-batches), lr 1e-4: how much of the difference more optimizer steps per
  sample would buy GRPO.

Iterations to the target are the first validated iteration at or above it. Wall time is the iterations' own time
(``time/iteration_s``: sampling, teacher, update), not the validations run to find the crossing; the wall-time ratio
is the median over seeds of each seed's distillation / GRPO pair (run back to back, under the same load). Runs are
fresh processes, one torch thread each, alternating the variants' order between seeds; medians over seeds. The last
line reads ``distill / GRPO iterations to 0.9: <ratio>`` (medians). Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import load_note  # noqa: E402

ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
VARIANTS = {
    "grpo": ["--config", "configs/grpo.yaml"],
    "distill": ["--config", "configs/distill.yaml"],
    "grpo_mb4": ["--config", "configs/grpo.yaml", "--model.loop.num_mini_batches=4"],
    "grpo_loop": ["--config", "configs/grpo.yaml", "--model.loop.ppo_epochs=2", "--model.loop.num_mini_batches=4"],
}
NAMES = {
    "grpo": "GRPO (configs/grpo.yaml)",
    "distill": "distillation (configs/distill.yaml)",
    "grpo_mb4": "GRPO, 4 mini-batches",
    "grpo_loop": "GRPO, 2 epochs x 4 mini-batches",
}


def run(variant: str, seed: int, args: argparse.Namespace, root: Path) -> dict:
    out = root / f"{variant}-{seed}"
    stop = (
        "{class_path: lightning.pytorch.callbacks.EarlyStopping, init_args: "
        f"{{monitor: val/reward, mode: max, stopping_threshold: {args.target}, patience: 1000000}}}}"
    )
    command = [
        sys.executable, "-m", "lightning_rl.cli", "fit", *VARIANTS[variant],
        "--seed_everything", str(seed), "--trainer.max_steps", str(args.max_iterations),
        "--trainer.val_check_interval", "1", "--trainer.enable_progress_bar", "false",
        "--model.loop.log_samples_every_n_steps", "0", "--trainer.default_root_dir", str(out),
        "--trainer.logger.init_args.save_dir", str(out), f"--trainer.callbacks=[{stop}]",
    ]  # fmt: skip
    proc = subprocess.run(command, cwd=ROOT, env={**os.environ, **ONE_THREAD}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} seed {seed} failed:\n{proc.stderr[-4000:]}")
    return summarise(out, args.target)


def summarise(out: Path, target: float) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = {p.parent for p in out.rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(events))
    acc.Reload()
    accuracy = {e.step: e.value for e in acc.Scalars("val/reward")}  # step: iterations done when it was validated
    seconds = {e.step + 1: e.value for e in acc.Scalars("time/iteration_s")}  # logged at iteration - 1
    reached = next((step for step in sorted(accuracy) if accuracy[step] >= target), None)
    last = reached if reached is not None else max(seconds)
    return {
        "iterations": reached,
        "seconds": sum(s for step, s in seconds.items() if step <= last),
        "per_iteration": statistics.mean(seconds.values()),
        "accuracy": accuracy[last],
        "start": accuracy[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--target", type=float, default=0.9, help="held-out greedy accuracy to reach")
    parser.add_argument("--max-iterations", type=int, default=80)
    args = parser.parse_args()
    print(f"before: {load_note()}")
    results: dict[str, list[dict]] = {v: [] for v in args.variants}
    with tempfile.TemporaryDirectory(prefix="distill_vs_rl_") as tmp:
        for seed in args.seeds:
            order = args.variants if seed % 2 == 0 else args.variants[::-1]
            for variant in order:
                r = run(variant, seed, args, Path(tmp))
                results[variant].append(r)
                print(
                    f"  {variant:9s} seed {seed}: accuracy {r['start']:.3f} -> {r['accuracy']:.3f} at iteration "
                    f"{r['iterations']}, {r['seconds']:.1f} s ({r['per_iteration']:.2f} s / iteration)",
                    flush=True,
                )
    print(f"after: {load_note()}")

    def median(variant: str, key: str) -> float | None:
        values = [r[key] for r in results[variant]]
        return None if any(v is None for v in values) else statistics.median(values)

    print(f"\n{len(args.seeds)} seed(s), 128 samples per iteration, target {args.target} held-out greedy accuracy\n")
    print("| variant | iterations to target (per seed) | median | wall time to target, median | s / iteration |")
    print("|---|---|---|---|---|")
    for variant in args.variants:
        per_seed = ", ".join(str(r["iterations"]) for r in results[variant])
        its, secs = median(variant, "iterations"), median(variant, "seconds")
        print(
            f"| {NAMES[variant]} | {per_seed} | {its if its is not None else 'not reached'} | "
            f"{f'{secs:.0f} s' if its is not None else '-'} | {median(variant, 'per_iteration'):.2f} |"
        )
    if {"grpo", "distill"} <= set(args.variants):
        grpo, distill = median("grpo", "iterations"), median("distill", "iterations")
        if grpo is None or distill is None:
            print(f"distill / GRPO iterations to {args.target}: not measured (a variant did not reach it)")
            return
        # each seed's two runs ran back to back, under the same load: the ratio of each pair, then the median
        pairs = [d["seconds"] / g["seconds"] for d, g in zip(results["distill"], results["grpo"])]
        print(
            f"\ndistill / GRPO wall time to {args.target}: {statistics.median(pairs):.2f} (median over seeds of each pair's ratio)"
        )
        controls = [v for v in ("grpo_mb4", "grpo_loop") if v in args.variants and median(v, "iterations") is not None]
        if controls:
            best = min(controls, key=lambda v: median(v, "iterations"))
            ratio = distill / median(best, "iterations")
            print(
                f"distill / (the fastest GRPO with more steps: {NAMES[best]}) iterations to {args.target}: {ratio:.2f}"
            )
        print(f"distill / GRPO iterations to {args.target}: {distill / grpo:.2f}")


if __name__ == "__main__":
    main()
