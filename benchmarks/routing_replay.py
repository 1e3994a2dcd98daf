"""Routing replay on a mixture-of-experts policy: the sampler in bfloat16, the trainer in fp32, GRPO, replay off vs on.

    python benchmarks/routing_replay.py                    # 3 seeds x {off, on}, configs/grpo_moe.yaml's 200 iterations
    python benchmarks/routing_replay.py --seeds 0 --iterations 2 --random-model --val-batches 1   # a smoke run

Every run is configs/grpo_moe.yaml (the shipped tiny Qwen3-MoE, lightning_rl/assets/tiny-arith-moe; ``--random-model``:
a random one of the same shape) with the in-process sampler in bfloat16 (``dtype: bfloat16``, what engines run,
reporting its log-probs) and the trainer in fp32, one with ``model.routing_replay: true``. Per iteration the run logs
the trainer/sampler log-prob gap over the tokens that count, |log pi_trainer - log pi_sampler| (``rollout/
logprob_diff_mean`` and ``_max``, taken in the update's forward, which replays the sampler's routes when replay is on)
and ``moe/route_agreement`` (the fraction of the sampler's token x layer x k routes the trainer's own routers also
choose). Reported per variant, mean +- standard deviation over seeds: the gap (the per-iteration maximum of the
per-token gap, averaged over iterations; the mean gap beside it, and split over the tokens whose routes all agree and
the others: ``moe/logprob_diff_mean_agreeing`` / ``_disagreeing``), the route agreement, and held-out greedy accuracy
(``val/reward``) after the last iteration. Fresh processes, one torch thread each, the variants' order alternating
between seeds. The last line reads ``logprob gap with / without routing replay: <ratio>`` (the max gap's ratio of the
means over seeds). Not part of the test suite.
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

from benchmarks._common import load_note, mean_std  # noqa: E402

ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
ASSET = ROOT / "lightning_rl" / "assets" / "tiny-arith-moe"
VARIANTS = {"off": "false", "on": "true"}


def random_model(directory: Path) -> str:
    """A random Qwen3-MoE of the asset's shape (8 experts, top-2, heads of 32) with the character tokenizer."""
    from lightning_rl.recipes.tiny import build_char_tokenizer, build_tiny_qwen3_moe

    tokenizer = build_char_tokenizer()
    model = build_tiny_qwen3_moe(tokenizer)  # the asset's shape, random weights
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def run(variant: str, seed: int, model: str, args: argparse.Namespace, root: Path) -> dict:
    out = root / f"{variant}-{seed}"
    command = [
        sys.executable, "-m", "lightning_rl.cli", "fit", "--config", "configs/grpo_moe.yaml",
        "--model.policy.path", model, f"--model.routing_replay={VARIANTS[variant]}",
        "--model.rollout.init_args.dtype=bfloat16", "--model.rollout.init_args.return_logprobs=true",
        "--seed_everything", str(seed), "--trainer.max_steps", str(args.iterations),
        "--trainer.val_check_interval", str(args.iterations), "--trainer.enable_progress_bar", "false",
        "--trainer.callbacks=[]", "--model.loop.log_samples_every_n_steps", "0",
        "--trainer.default_root_dir", str(out), "--trainer.logger.init_args.save_dir", str(out),
    ]  # fmt: skip
    if args.val_batches is not None:
        command += ["--trainer.limit_val_batches", str(args.val_batches)]
    proc = subprocess.run(command, cwd=ROOT, env={**os.environ, **ONE_THREAD}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"replay {variant} seed {seed} failed:\n{proc.stderr[-4000:]}")
    return summarise(out)


def summarise(out: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = {p.parent for p in out.rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(events))
    acc.Reload()

    def series(tag: str) -> list[float]:
        return [e.value for e in acc.Scalars(tag)]

    accuracy = acc.Scalars("val/reward")
    return {
        "gap_max": statistics.mean(series("rollout/logprob_diff_max")),
        "gap_mean": statistics.mean(series("rollout/logprob_diff_mean")),
        "agreement": statistics.mean(series("moe/route_agreement")),
        "gap_agreeing": statistics.mean(series("moe/logprob_diff_mean_agreeing")),
        "gap_disagreeing": statistics.mean(series("moe/logprob_diff_mean_disagreeing")),
        "start": accuracy[0].value,
        "accuracy": accuracy[-1].value,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=200, help="GRPO iterations per run (the preset's 200)")
    parser.add_argument("--random-model", action="store_true", help="a random tiny Qwen3-MoE instead of the asset")
    parser.add_argument("--val-batches", type=int, default=None, help="held-out batches validated (None: all)")
    args = parser.parse_args()
    print(f"before: {load_note()}")
    results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="routing_replay_") as tmp:
        model = random_model(Path(tmp) / "moe") if args.random_model else str(ASSET)
        if not Path(model).is_dir():
            raise SystemExit(f"no model at {model}: build it (scripts/make_tiny_moe.py) or pass --random-model")
        for seed in args.seeds:
            for variant in list(VARIANTS) if seed % 2 == 0 else list(VARIANTS)[::-1]:
                r = run(variant, seed, model, args, Path(tmp))
                results[variant].append(r)
                print(
                    f"  replay {variant:3s} seed {seed}: gap max {r['gap_max']:.4f} mean {r['gap_mean']:.5f}, route "
                    f"agreement {r['agreement']:.4f}, accuracy {r['start']:.3f} -> {r['accuracy']:.3f}",
                    flush=True,
                )
    print(f"after: {load_note()}")
    print(f"\n{len(args.seeds)} seed(s), {args.iterations} iterations, sampler bfloat16, trainer fp32 (mean +- std)\n")
    print(
        "| routing replay | log-prob gap, max per iteration | mean gap | mean gap, routes agree | mean gap, routes "
        "disagree | route agreement | held-out accuracy |"
    )
    print("|---|---|---|---|---|---|---|")
    keys = ("gap_max", "gap_mean", "gap_agreeing", "gap_disagreeing", "agreement", "accuracy")
    for variant, rows in results.items():
        cells = [mean_std([r[k] for r in rows]) for k in keys]
        print(f"| {variant} | " + " | ".join(cells) + " |")
    off = statistics.mean(r["gap_max"] for r in results["off"])
    on = statistics.mean(r["gap_max"] for r in results["on"])
    print(f"logprob gap with / without routing replay: {on / off:.3f}")


if __name__ == "__main__":
    main()
