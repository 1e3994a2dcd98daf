"""Asynchronous against synchronous GRPO on an SGLang-API server in its own process: samples/s, the trainer's wait
for samples, and held-out greedy accuracy after the same number of samples.

    python benchmarks/async_vs_sync.py                          # 3 seeds x {sync, max_staleness 1}, alternated
    python benchmarks/async_vs_sync.py --seeds 0 --iterations 20

Both variants: the shipped tiny policy, `builtin:arithmetic`, configs/grpo.yaml on configs/rollout/sglang.yaml
(4 prompts x 32 samples per iteration, 8 new tokens), the same seed, iterations and held-out set. Overlap pays
most when sampling and training take about as long: on 2 CPU cores with this tiny model, 4 x 32 balances them
(16 x 8 costs the server twice as many requests for the same samples; try --prompts 16 --group-size 8). The async variant
stacks configs/loop/async.yaml (loop.max_staleness 1, DecoupledClip, old log-probs recomputed). The server is the
loopback stand-in the tests use (tests/fixtures/sglang_server.py: SGLang's native API over a transformers model),
one process, one torch thread, pinned to one core; the trainer is another process with one torch thread, pinned to
the other core. Samples/s is over the
iterations' wall clock (first iteration's end to the last's: everything between them counted), not start-up or
the validation before and after. Accuracy is `val/reward` after the last iteration (greedy, exact match). Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import load_note  # noqa: E402
from components.rollout.sglang.server import free_port  # noqa: E402

MODEL = ROOT / "lightning_rl" / "assets" / "tiny-arith"
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
PHASES = ("time/rollout_s", "time/score_s", "time/estimate_s", "time/optimize_s", "time/sync_s")


def pinned(core: int):
    """Run the child on one core (the server on one, the trainer on the other), where the machine has two or more."""
    return (lambda: os.sched_setaffinity(0, {core})) if len(os.sched_getaffinity(0)) >= 2 else None


def start_server(port: int) -> subprocess.Popen:
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.fixtures.sglang_server", "--model-path", str(MODEL), "--port", str(port)],
        cwd=ROOT, env={**os.environ, **ONE_THREAD}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=pinned(0),
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise RuntimeError("the loopback SGLang server did not start")


def run(variant: str, seed: int, args: argparse.Namespace, root: Path) -> dict:
    port = free_port()
    server = start_server(port)
    out = root / f"{variant}-{seed}"
    configs = ["--config", "configs/grpo.yaml", "--config", "configs/rollout/sglang.yaml"]
    if variant == "async":
        configs += ["--config", "configs/loop/async.yaml"]
    command = [
        sys.executable, "-m", "lightning_rl.cli", "fit", *configs,
        "--model.rollout.init_args.servers.urls", f"[http://127.0.0.1:{port}]",
        "--model.rollout.init_args.verify.every", "0",  # the overlap is measured; the push's check would cost both variants alike
        "--seed_everything", str(seed), "--trainer.max_steps", str(args.iterations), "--trainer.val_check_interval", "100000",
        "--data.val_size", str(args.val_size), "--data.batch_size", str(args.prompts), "--model.rollout.init_args.group_size", str(args.group_size),
 "--trainer.enable_progress_bar", "false", "--model.loop.log_samples_every_n_steps", "0",
        "--trainer.default_root_dir", str(out), "--trainer.logger.init_args.save_dir", str(out),
        "--trainer.callbacks.init_args.dirpath", str(out / "checkpoints"),
    ]  # fmt: skip
    try:
        proc = subprocess.run(
            command, cwd=ROOT, env={**os.environ, **ONE_THREAD}, capture_output=True, text=True, preexec_fn=pinned(1)
        )
    finally:
        server.terminate()
        server.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} seed {seed} failed:\n{proc.stderr[-4000:]}")
    return summarise(out, args.prompts * args.group_size)


def summarise(out: Path, samples_per_iteration: int) -> dict:
    """Samples/s over the iterations' wall clock: from the end of the first iteration to the end of the last (every
    cost between them counted: logging, checkpoints, Lightning's loop; the validation runs before and after)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = {p.parent for p in out.rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(events))
    acc.Reload()
    series = {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    ends = [e.wall_time for e in acc.Scalars("time/optimize_s")]  # written once per iteration, at its end
    return {
        "samples_per_s": samples_per_iteration * (len(ends) - 1) / (ends[-1] - ends[0]),
        "rollout_wait_s": statistics.mean(series["time/rollout_wait_s"]),
        "accuracy_before": series["val/reward"][0],
        "accuracy": series["val/reward"][-1],
        "staleness": statistics.mean(series.get("async/staleness_mean", [0.0])),
        "phases_ms": {tag.split("/")[1][:-2]: round(1e3 * statistics.mean(series[tag])) for tag in PHASES},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--val-size", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per iteration")
    parser.add_argument("--group-size", type=int, default=32, help="samples per prompt")
    args = parser.parse_args()
    print(f"before: {load_note()}")
    results: dict[str, list[dict]] = {"sync": [], "async": []}
    with tempfile.TemporaryDirectory(prefix="async_vs_sync_") as tmp:
        for seed in args.seeds:
            for variant in ("sync", "async") if seed % 2 == 0 else ("async", "sync"):  # A/B, then B/A
                result = run(variant, seed, args, Path(tmp))
                results[variant].append(result)
                print(
                    f"  {variant:5s} seed {seed}: {result['samples_per_s']:.1f} samples/s, wait {result['rollout_wait_s'] * 1e3:.0f} ms/iteration, "
                    f"accuracy {result['accuracy_before']:.3f} -> {result['accuracy']:.3f}; ms per phase {result['phases_ms']}",
                    flush=True,
                )
    print(f"after: {load_note()}")
    mean = lambda variant, key: statistics.mean(r[key] for r in results[variant])  # noqa: E731
    print(
        f"\n{len(args.seeds)} seed(s), {args.iterations} iterations x {args.prompts} prompts x {args.group_size} samples, held-out set of {args.val_size}\n"
    )
    print(
        "| loop | samples/s | time/rollout_wait_s (mean per iteration) | staleness (mean) | held-out accuracy after |"
    )
    print("|---|---|---|---|---|")
    for variant, name in (("sync", "synchronous"), ("async", "max_staleness: 1")):
        print(
            f"| {name} | {mean(variant, 'samples_per_s'):.1f} | {mean(variant, 'rollout_wait_s') * 1e3:.0f} ms | "
            f"{mean(variant, 'staleness'):.2f} | {mean(variant, 'accuracy'):.3f} |"
        )
    speedup = mean("async", "samples_per_s") / mean("sync", "samples_per_s")
    print(
        f"\nasync / sync samples/s: {speedup:.2f}x; accuracy difference {100 * (mean('async', 'accuracy') - mean('sync', 'accuracy')):+.1f} points"
    )


if __name__ == "__main__":
    main()
