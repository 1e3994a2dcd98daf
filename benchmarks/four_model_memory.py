"""Peak memory of one PPO-RLHF iteration with four models against the 16 B / trainable + 2 B / frozen bill,
and the same iteration with a LoRA policy and critic.

    python benchmarks/four_model_memory.py                    # hidden 512, 8 layers: ~25M parameters per model
    python benchmarks/four_model_memory.py --hidden 256 --layers 4
    python benchmarks/four_model_memory.py --shipped          # the shipped tiny policy and reward model
    python benchmarks/four_model_memory.py --lora_rank 0      # full fine-tuning only (the original report)

Full fine-tuning: policy and critic train in fp32 (weights 4 + gradients 4 + two Adam moments 8 = 16
bytes per parameter, the same bill as mixed-precision Adam); reference and reward model are frozen in
bf16 (2 bytes). LoRA row: the policy (fp32 base, frozen) trains rank-r adapters on every linear layer;
there is no reference model (reference log-probs come from the policy with its adapters off); the
critic is initialised from the policy and shares its frozen base tensors, training its own adapters
and value head; the reward model is the same frozen bf16 model. Each configuration runs one iteration
of configs/ppo_rlhf.yaml on CPU with a tiny batch, in its own process (peak RSS is per process), and reports:
  * exact tensor bytes: parameters (each storage counted once), gradients, optimizer state;
  * process peak resident memory (ru_maxrss) minus the resident memory after imports;
  * the size of the checkpoint file Lightning writes (full: trainable weights + Adam state; LoRA: adapters,
    value head + Adam state, the frozen base reloaded from its path).
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MB = 2**20


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MB


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def models(scratch: Path, hidden: int, layers: int, shipped: bool) -> tuple[str, str]:
    """(policy path, reward model path): the shipped pair, or a random pair of the given size."""
    if shipped:
        from lightning_rl.core.models import TINY_MODEL_PATH

        return TINY_MODEL_PATH, str(ROOT / "lightning_rl" / "assets" / "tiny-arith-rm")
    from transformers import LlamaForSequenceClassification

    from lightning_rl.recipes.tiny import build_char_tokenizer, build_tiny_llama

    tokenizer = build_char_tokenizer()
    policy = build_tiny_llama(tokenizer, hidden_size=hidden, layers=layers, heads=8)
    policy.config.max_position_embeddings = 64
    policy.save_pretrained(scratch / "policy")
    tokenizer.save_pretrained(scratch / "policy")
    config = policy.config
    config.num_labels = 1
    LlamaForSequenceClassification(config).save_pretrained(scratch / "rm")
    tokenizer.save_pretrained(scratch / "rm")
    return str(scratch / "policy"), str(scratch / "rm")


def measure(hidden: int, layers: int, shipped: bool, lora_rank: int) -> dict:
    """One PPO-RLHF iteration in this process; full fine-tuning when ``lora_rank`` is 0."""
    import torch

    from lightning_rl.cli import DEFAULT_TRAINER_CONFIG
    from lightning_rl.cli import main as cli_main

    torch.set_num_threads(2)
    base = rss_mb()
    scratch = Path(tempfile.mkdtemp())
    policy_path, rm_path = models(scratch, hidden, layers, shipped)
    if lora_rank:
        variant = [
            f"--model.policy.lora.rank={lora_rank}", f"--model.policy.lora.alpha={2 * lora_rank}", "--model.reference=null",
            "--model.critic.init_args.init_from=policy", f"--model.critic.init_args.lora.rank={lora_rank}",
            f"--model.critic.init_args.lora.alpha={2 * lora_rank}",
        ]  # fmt: skip
    else:
        variant = [f"--model.reference.path={policy_path}", "--model.reference.dtype=bfloat16"]
    cli = cli_main(
        [
            "--config", DEFAULT_TRAINER_CONFIG, "--config", str(ROOT / "configs/ppo_rlhf.yaml"),
            f"--model.policy.path={policy_path}", *variant,
            f"--model.reward.init_args.path={rm_path}", "--model.reward.init_args.dtype=bfloat16",
            "--data.batch_size=2", "--data.val_data=null", "--model.loop.ppo_epochs=1", "--model.loop.num_mini_batches=1",
            "--trainer.max_steps=1", "--trainer.logger=false", "--trainer.callbacks=[]", "--trainer.enable_checkpointing=false",
            f"--trainer.default_root_dir={scratch}", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        ],
        run=False,
    )  # fmt: skip
    module = cli.model
    cli.trainer.fit(module, datamodule=cli.datamodule)
    peak = peak_rss_mb() - base
    cli.trainer.save_checkpoint(scratch / "last.ckpt")

    roots = [
        m
        for m in (module.policy, module.critic, module.reference, getattr(module.reward, "model", None))
        if m is not None
    ]
    unique = {p.data_ptr(): p for m in roots for p in m.parameters()}.values()  # a shared frozen base counts once
    trainable = [p for p in unique if p.requires_grad]
    frozen = [p for p in unique if not p.requires_grad]
    optimizer = module.optimizers().optimizer
    state_bytes = sum(
        t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)
    )
    nbytes = lambda ps: sum(p.numel() * p.element_size() for p in ps)  # noqa: E731
    return {
        "mode": f"LoRA r={lora_rank}" if lora_rank else "full",
        "trainable": sum(p.numel() for p in trainable),
        "frozen": sum(p.numel() for p in frozen),
        "frozen_bytes": nbytes(frozen),
        "weight_bytes": nbytes(trainable) + nbytes(frozen),
        "grad_bytes": nbytes(trainable),  # alive between backward and zero_grad
        "state_bytes": state_bytes,
        "state_entries": len(optimizer.state),
        "trainable_tensors": len(trainable),
        "frozen_in_optimizer": sum(any(p is q for g in optimizer.param_groups for q in g["params"]) for p in frozen),
        "peak_rss_mb": peak,
        "checkpoint_bytes": (scratch / "last.ckpt").stat().st_size,
        "reference_loaded": module.reference is not None,
    }


def report(row: dict) -> None:
    bill = 16 * row["trainable"] + row["frozen_bytes"]
    exact = row["weight_bytes"] + row["grad_bytes"] + row["state_bytes"]
    print(f"[{row['mode']}] trainable parameters: {row['trainable']:,}; frozen: {row['frozen']:,} ({row['frozen_bytes'] / MB:.1f} MB)"
          f"; reference model loaded: {row['reference_loaded']}")  # fmt: skip
    print(f"  bill 16 B x trainable + frozen bytes:      {bill / MB:8.1f} MB")
    print(
        f"  exact tensors: weights {row['weight_bytes'] / MB:.1f} + gradients {row['grad_bytes'] / MB:.1f} + Adam state {row['state_bytes'] / MB:.1f} = {exact / MB:8.1f} MB"
    )
    print(
        f"  Adam state entries: {row['state_entries']} (= trainable tensors: {row['trainable_tensors']}); frozen tensors in the optimizer: {row['frozen_in_optimizer']}"
    )
    print(
        f"  process peak RSS above post-import baseline: {row['peak_rss_mb']:8.1f} MB ({row['peak_rss_mb'] * MB / bill:.2f}x the bill)"
    )
    print(f"  checkpoint file: {row['checkpoint_bytes'] / MB:.2f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument(
        "--shipped",
        action="store_true",
        help="use the shipped tiny policy and reward model (ignores --hidden/--layers)",
    )
    parser.add_argument("--lora_rank", type=int, default=4, help="rank of the LoRA row (0 = full fine-tuning only)")
    parser.add_argument(
        "--only", choices=["full", "lora"], default=None, help=argparse.SUPPRESS
    )  # one configuration, JSON out
    args = parser.parse_args()
    if args.only:
        print(json.dumps(measure(args.hidden, args.layers, args.shipped, args.lora_rank if args.only == "lora" else 0)))
        return
    rows = []
    for only in ["full"] + (["lora"] if args.lora_rank else []):
        cmd = [
            sys.executable,
            __file__,
            "--only",
            only,
            "--hidden",
            str(args.hidden),
            "--layers",
            str(args.layers),
            "--lora_rank",
            str(args.lora_rank),
        ]
        out = subprocess.run(
            [*cmd, *(["--shipped"] if args.shipped else [])], capture_output=True, text=True, check=True
        ).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        report(rows[-1])
    if len(rows) == 2:
        full, lora = rows
        state = lambda r: r["weight_bytes"] + r["grad_bytes"] + r["state_bytes"]  # noqa: E731
        print("\n| | full fine-tuning | LoRA | ratio |\n|---|---|---|---|")
        print(
            f"| peak RSS above baseline | {full['peak_rss_mb']:,.1f} MB | {lora['peak_rss_mb']:,.1f} MB | {full['peak_rss_mb'] / lora['peak_rss_mb']:.2f}x |"
        )
        print(
            f"| parameters + gradients + optimizer state | {state(full) / MB:,.1f} MB | {state(lora) / MB:,.1f} MB | {state(full) / state(lora):.2f}x |"
        )
        print(
            f"| optimizer state | {full['state_bytes'] / MB:,.2f} MB | {lora['state_bytes'] / MB:,.2f} MB | {full['state_bytes'] / lora['state_bytes']:.1f}x |"
        )
        print(
            f"| checkpoint file | {full['checkpoint_bytes'] / MB:,.2f} MB | {lora['checkpoint_bytes'] / MB:,.2f} MB | {full['checkpoint_bytes'] / lora['checkpoint_bytes']:.1f}x |"
        )


if __name__ == "__main__":
    main()
