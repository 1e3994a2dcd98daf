"""Where one RL iteration spends its time: per phase, for GRPO and for four-model PPO-RLHF.

    python benchmarks/step_breakdown.py                          # both presets, 12 iterations each, CPU
    python benchmarks/step_breakdown.py --preset grpo --steps 30
    python benchmarks/step_breakdown.py --reward-model lightning_rl/assets/tiny-arith-rm
    python benchmarks/step_breakdown.py --accelerator gpu        # on a GPU host
    python benchmarks/step_breakdown.py --preset grpo --set data.batch_size=8   # any config override
    python benchmarks/step_breakdown.py --accelerator gpu --sync-debug           # where the loop waits for the GPU

Runs the shipped presets as they are (configs/grpo.yaml: 16 prompts x 8 samples; configs/ppo_rlhf.yaml:
32 prompts x 1 sample, 4 epochs x 2 mini-batches, policy + critic + reference + reward model) with the
shipped tiny policy, without logger, checkpoints or validation. PPO needs a reward model directory:
``--reward-model`` (e.g. written by scripts/make_reward_model.py), else the shipped
lightning_rl/assets/tiny-arith-rm when it exists, else a random sequence classifier of the policy's
shape built here (the timing does not depend on what the reward model learned).

Phases, in ms per iteration (mean over the iterations after ``--warmup``):
  generate   rollout.generate (sampling, KV cache)            } the module's time/rollout_s
  reward     the reward component (exact match; reward model)  }
  score      no-grad forward passes: old / reference log-probs, values (time/score_s)
  estimate   KL-in-reward, advantages (time/estimate_s)
  optimize   epochs x mini-batches x micro-batches: forward, backward, clip, AdamW step (time/optimize_s)
  sync       rollout.sync_weights + adaptive KL (time/sync_s)
  other      the rest of the iteration: decoding for the reward, metrics and self.log, Lightning's loop
Generation and reward are timed by wrapping the two components in this process; the other phases
are the module's own ``time/*`` metrics, read from ``trainer.callback_metrics`` after each iteration.
Tokens/s counts generated response tokens per second of the whole iteration.

``--sync-debug`` (CUDA only) turns on ``torch.cuda.set_sync_debug_mode("warn")`` after the warm-up and
counts the host-device synchronisations per iteration by the line of lightning_rl / components code
that triggered them. The module's phase timer synchronises on purpose (``lightning_rl/metrics.py``
lines in the list: two per phase); this script's own timing does not count.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, emit, load_note, run_worker  # noqa: E402

PHASES = ("generate", "reward", "score", "estimate", "optimize", "sync", "other")


def random_reward_model(policy_path: str, directory: str) -> str:
    """A randomly initialised sequence classifier (num_labels=1) with the policy's shape and tokenizer."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    config = AutoConfig.from_pretrained(policy_path)
    config.num_labels = 1
    AutoModelForSequenceClassification.from_config(config).save_pretrained(directory)
    AutoTokenizer.from_pretrained(policy_path).save_pretrained(directory)
    return directory


def _timed(fn, seconds: dict, name: str, sync, count=None):
    """``fn`` that adds its wall time to ``seconds[name]`` (and ``count(result)`` to ``seconds["tokens"]``)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        sync()
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        sync()
        seconds[name] += time.perf_counter() - start
        if count is not None:
            seconds["tokens"] += count(result)
        return result

    return wrapper


def run_preset(args) -> dict:
    import torch
    from lightning import Callback

    from components.reward.model import TINY_REWARD_MODEL_PATH
    from lightning_rl.cli import DEFAULT_TRAINER_CONFIG
    from lightning_rl.cli import main as cli_main
    from lightning_rl.core.models import TINY_MODEL_PATH

    torch.set_num_threads(args.threads)

    def sync() -> None:
        """Wait for the GPU around a timed call, without counting as a sync under --sync-debug."""
        if torch.cuda.is_available():
            mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode(mode)

    scratch = tempfile.mkdtemp(prefix=f"bench-{args.worker}-")
    overrides = [
        f"--model.policy.path={TINY_MODEL_PATH}", "--seed_everything=0", "--data.val_data=null",
        "--model.loop.log_samples_every_n_steps=0", f"--trainer.max_steps={args.steps}", "--trainer.logger=false",
        "--trainer.callbacks=[]", "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", f"--trainer.default_root_dir={scratch}", f"--trainer.accelerator={args.accelerator}",
    ]  # fmt: skip
    if args.worker == "ppo_rlhf":
        rm = args.reward_model or (
            TINY_REWARD_MODEL_PATH if Path(TINY_REWARD_MODEL_PATH, "config.json").exists() else None
        )
        rm = rm or random_reward_model(TINY_MODEL_PATH, str(Path(scratch) / "rm"))
        overrides.append(f"--model.reward.init_args.path={rm}")
    config = ROOT / "configs" / f"{args.worker}.yaml"
    overrides += [f"--{item}" for item in args.set]
    cli = cli_main(["--config", DEFAULT_TRAINER_CONFIG, "--config", str(config), *overrides], run=False)
    module, trainer = cli.model, cli.trainer
    per_step: list[dict[str, float]] = []
    wrapped: dict[str, float] = defaultdict(float)
    stamps: list[tuple[float, float]] = []

    class Read(Callback):
        def on_fit_start(self, trainer, module):
            # the components exist now (configure_model ran): wrap the sampler and the reward to time them
            count = lambda batch: float(batch.response_mask.sum())  # noqa: E731
            module.rollout.generate = _timed(module.rollout.generate, wrapped, "generate", sync, count)
            reward_cls = type(module.reward)
            reward_cls.__call__ = _timed(reward_cls.__call__, wrapped, "reward", sync)
            stamps.append((time.perf_counter(), time.process_time()))

        def on_train_batch_end(self, trainer, module, *_):
            stamps.append((time.perf_counter(), time.process_time()))
            m = trainer.callback_metrics
            row = {k.split("/", 1)[1].removesuffix("_s"): float(v) for k, v in m.items() if k.startswith("time/")}
            row["rollout_total"] = row.pop("rollout", 0.0)
            row.update(generate=wrapped.pop("generate", 0.0), reward=wrapped.pop("reward", 0.0))
            row["response_tokens"] = wrapped.pop("tokens", 0.0)
            row["wall"] = stamps[-1][0] - stamps[-2][0]
            row["cpu"] = stamps[-1][1] - stamps[-2][1]
            per_step.append(row)

    syncs: Counter = Counter()

    class CountSyncs(Callback):
        """Count CUDA synchronisations per code line after the warm-up (torch's sync debug mode warns on each)."""

        def on_train_batch_start(self, trainer, module, *_):
            if trainer.global_step == args.warmup:
                original = warnings.showwarning

                def record(message, category, filename, lineno, file=None, line=None):
                    if "synchronizing" not in str(message):
                        return original(message, category, filename, lineno, file, line)
                    ours = [
                        f
                        for f in traceback.extract_stack()[:-1]
                        if ("/lightning_rl/" in f.filename or "/components/" in f.filename)
                    ]
                    site = (
                        f"{Path(ours[-1].filename).parent.name}/{Path(ours[-1].filename).name}:{ours[-1].lineno} {ours[-1].line}"
                        if ours
                        else "outside lightning_rl"
                    )
                    syncs[site] += 1

                warnings.showwarning = record
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")

        def on_train_end(self, trainer, module):
            torch.cuda.set_sync_debug_mode("default")

    samples = cli.datamodule.hparams.batch_size * module.rollout.group_size  # sampled responses per iteration
    trainer.callbacks.append(Read())
    if args.sync_debug:
        if not torch.cuda.is_available():
            raise SystemExit("--sync-debug needs a CUDA device (--accelerator gpu)")
        trainer.callbacks.append(CountSyncs())
    trainer.fit(module, datamodule=cli.datamodule)
    timed = max(1, len(per_step) - args.warmup)
    return {"per_step": per_step, "samples": samples, "device": str(module.device),
            "syncs": {site: n / timed for site, n in syncs.most_common(25)}}  # fmt: skip


def summarise(name: str, out: dict, warmup: int) -> list[str]:
    rows = out["per_step"][warmup:]
    if not rows:
        raise ValueError(f"{name}: no iteration after the {warmup} warm-up iteration(s); raise --steps")
    mean = {k: statistics.mean(r.get(k, 0.0) for r in rows) for k in rows[0]}
    known = sum(mean.get(k, 0.0) for k in ("score", "estimate", "optimize", "sync")) + mean["generate"] + mean["reward"]
    mean["other"] = mean["wall"] - known
    wall = mean["wall"]
    lines = [f"### {name} ({out['samples']} samples per iteration, {len(rows)} iterations timed, {out['device']})", "",
             "| phase | ms / iteration | share |", "|---|---|---|"]  # fmt: skip
    for phase in PHASES:
        lines.append(f"| {phase} | {1000 * mean.get(phase, 0.0):.1f} | {100 * mean.get(phase, 0.0) / wall:.0f}% |")
    lines.append(f"| **iteration** | **{1000 * wall:.1f}** (process CPU {1000 * mean['cpu']:.1f}) | |")
    tokens = mean["response_tokens"]
    lines += ["", f"{out['samples'] / wall:.1f} samples/s, {tokens / wall:.0f} generated tokens/s "
              f"({tokens / out['samples']:.2f} tokens per response)", ""]  # fmt: skip
    if out.get("syncs"):
        lines += ["host-device synchronisations per iteration, by the line that asked:", ""]
        lines += [f"    {n:6.1f}  {site}" for site, n in out["syncs"].items()] + [""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=["grpo", "ppo_rlhf", "both"], default="both")
    parser.add_argument("--steps", type=int, default=12, help="RL iterations per preset")
    parser.add_argument("--warmup", type=int, default=2, help="iterations left out of the means")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--accelerator", default="cpu", help="Lightning accelerator: cpu, gpu, auto")
    parser.add_argument("--reward-model", default=None, help="reward model directory for ppo_rlhf")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override for every preset, e.g. data.batch_size=8",
    )
    parser.add_argument(
        "--sync-debug", action="store_true", help="CUDA: count host-device syncs per iteration by code line"
    )
    parser.add_argument("--worker", choices=["grpo", "ppo_rlhf"], help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        emit(run_preset(args))
        return
    presets = ["grpo", "ppo_rlhf"] if args.preset == "both" else [args.preset]
    print(f"before: {load_note()}", flush=True)
    common = [f"--steps={args.steps}", f"--threads={args.threads}", f"--accelerator={args.accelerator}"]
    if args.reward_model:
        common.append(f"--reward-model={args.reward_model}")
    common += (
        [f"--set={item}" for item in args.set]
        + [f"--warmup={args.warmup}"]
        + (["--sync-debug"] if args.sync_debug else [])
    )
    outputs = {name: run_worker(Path(__file__), [f"--worker={name}", *common]) for name in presets}
    print(f"after: {load_note()}\n")
    for name in presets:
        print("\n".join(summarise(name, outputs[name], args.warmup)))


if __name__ == "__main__":
    main()
