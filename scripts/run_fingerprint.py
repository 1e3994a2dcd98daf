"""Fingerprint a training run: a digest of every trained parameter and of every logged scalar after each RL iteration.

    python scripts/run_fingerprint.py --config configs/grpo.yaml --iterations 6 --out /tmp/grpo.json
    python scripts/run_fingerprint.py --config configs/ppo_rlhf.yaml --iterations 4 --seed 1

Two runs of the same preset, seed and iteration count on two versions of the code print the same table when the
refactor between them changed no number: the weights and the logged scalars are compared bit for bit (SHA-256 of the
raw bytes of each trained tensor, the exact float of each scalar). Scalars that measure the machine rather than the
run (``time/``, ``throughput/``, ``memory/``, ``async/rollout_s``) are left out of the digest and listed. The run is on CPU, with one torch
thread (a different thread count may sum in another order), no validation and no checkpoint files.

The code measured is whichever ``lightning_rl`` the interpreter imports: run the script with another checkout's
interpreter, from a folder outside both checkouts, to fingerprint that checkout, e.g.
``cd /tmp && /path/to/other/.venv/bin/python /path/to/this/scripts/run_fingerprint.py --config configs/grpo.yaml``
(``--config`` is read relative to the imported package's checkout unless it is absolute). Compare two JSON files with
``--compare a.json b.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
import tempfile
from pathlib import Path

MACHINE_SCALARS = ("time/", "throughput/", "memory/", "async/rollout_s")
"""Scalars that measure the machine (wall-clock times, rates, memory): listed, never compared."""


def tensor_digest(tensors: dict) -> str:
    """SHA-256 over (name, dtype, shape, raw bytes) of each tensor, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(-1).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def float_bits(value: float) -> str:
    return struct.pack(">d", float(value)).hex()


def scalar_digest(scalars: dict[str, float]) -> str:
    h = hashlib.sha256()
    for name in sorted(scalars):
        h.update(f"{name}={float_bits(scalars[name])};".encode())
    return h.hexdigest()[:16]


def fingerprint(config: str, iterations: int, seed: int, extra: list[str]) -> dict:
    import torch
    from lightning import Callback
    from lightning.pytorch.loggers.logger import Logger

    import lightning_rl
    from lightning_rl.cli import DEFAULT_TRAINER_CONFIG, main

    torch.set_num_threads(1)
    root = Path(lightning_rl.__file__).resolve().parents[1]
    config_path = Path(config) if Path(config).is_absolute() else root / config
    records: list[dict] = []

    class Recorder(Logger):
        """Keeps what the run logs at each step (the iteration metrics arrive in one call per iteration)."""

        name, version, experiment = "fingerprint", 0, None
        logged: dict[int, dict[str, float]] = {}

        def log_metrics(self, metrics, step=None):
            self.logged.setdefault(int(step or 0), {}).update({k: float(v) for k, v in metrics.items()})

        def log_hyperparams(self, params, *args, **kwargs):
            pass

    class Snapshot(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            trained = {n: p for n, p in pl_module.named_parameters() if p.requires_grad}
            buffers = {n: b for n, b in pl_module.named_buffers() if b.is_floating_point()}
            records.append(
                {"iteration": trainer.global_step, "params": tensor_digest(trained), "buffers": tensor_digest(buffers)}
            )

    with tempfile.TemporaryDirectory() as tmp:
        # run=False builds no subcommand, so fit's default trainer settings come first by hand, as `fit` stacks them
        args = ["--config", DEFAULT_TRAINER_CONFIG, "--config", str(config_path)]
        args += extra
        args += [
            f"--seed_everything={seed}",
            f"--trainer.max_steps={iterations}",
            "--trainer.accelerator=cpu",
            "--trainer.devices=1",
            "--trainer.limit_val_batches=0",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_checkpointing=false",
            "--trainer.callbacks=[]",
            f"--trainer.default_root_dir={tmp}",
            "--trainer.logger=lightning.pytorch.loggers.TensorBoardLogger",
            f"--trainer.logger.save_dir={tmp}",
            "--trainer.logger.name=fingerprint",
            "--model.loop.log_samples_every_n_steps=0",
        ]
        sys.argv = sys.argv[:1]  # the CLI reads these arguments, not the script's
        cli = main(args, run=False)
        recorder = Recorder()
        cli.trainer.loggers = [*cli.trainer.loggers, recorder]
        cli.trainer.callbacks.append(Snapshot())
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    excluded = set()
    for record in records:
        scalars = recorder.logged.get(record["iteration"] - 1, {})
        kept = {k: v for k, v in scalars.items() if not k.startswith(MACHINE_SCALARS)}
        excluded |= set(scalars) - set(kept)
        record["scalars"] = scalar_digest(kept)
        record["values"] = {k: float_bits(v) for k, v in sorted(kept.items())}
    return {
        "config": config,
        "seed": seed,
        "iterations": iterations,
        "code": str(root),
        "excluded": sorted(excluded),
        "records": records,
    }


def print_table(result: dict) -> None:
    print(f"{result['config']}  seed {result['seed']}  code {result['code']}")
    print(f"{'iteration':>9}  {'trained parameters':18}  {'buffers':18}  {'logged scalars':18}  scalars")
    for r in result["records"]:
        print(f"{r['iteration']:>9}  {r['params']:18}  {r['buffers']:18}  {r['scalars']:18}  {len(r['values'])}")
    print(f"left out of the digest (they measure the machine): {', '.join(result['excluded'])}")
    print(f"run digest: {scalar_digest({json.dumps(r, sort_keys=True): 0.0 for r in result['records']})}")


def compare(a: dict, b: dict) -> int:
    """0 when every iteration's digests agree; else the first difference, by name, and 1."""
    for ra, rb in zip(a["records"], b["records"]):
        for key in ("params", "buffers"):
            if ra[key] != rb[key]:
                print(f"iteration {ra['iteration']}: {key} differ")
                return 1
        names = {k for k in set(ra["values"]) | set(rb["values"]) if not k.startswith(MACHINE_SCALARS)}
        differ = sorted(k for k in names if ra["values"].get(k) != rb["values"].get(k))
        if differ:
            print(f"iteration {ra['iteration']}: scalars differ: {differ}")
            return 1
    if len(a["records"]) != len(b["records"]):
        print(f"{len(a['records'])} iterations against {len(b['records'])}")
        return 1
    compared = [k for k in a["records"][-1]["values"] if not k.startswith(MACHINE_SCALARS)]
    print(f"identical: {len(a['records'])} iterations, parameters, buffers and {len(compared)} scalars")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="a preset, e.g. configs/grpo.yaml")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the full fingerprint (every scalar's bits) as JSON here")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two JSON files written by --out")
    parser.add_argument("overrides", nargs="*", help="more `lightning-rl fit` arguments, after --")
    args = parser.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        return compare(a, b)
    if not args.config:
        parser.error("--config is required (or --compare A B)")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = fingerprint(args.config, args.iterations, args.seed, args.overrides)
    print_table(result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
