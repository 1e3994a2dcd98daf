"""Peak memory of one PPO-RLHF iteration with four models against the 16 B / trainable + 2 B / frozen bill.

    python benchmarks/four_model_memory.py                    # hidden 512, 8 layers: ~25M parameters per model
    python benchmarks/four_model_memory.py --hidden 256 --layers 4

Policy and critic train in fp32 (weights 4 + gradients 4 + two Adam moments 8 = 16 bytes per
parameter, the same bill as mixed-precision Adam); reference and reward model are frozen in bf16
(2 bytes). Runs one iteration of configs/ppo_rlhf.yaml on CPU with a tiny batch, so activations are
small next to the weights, and reports:
  * exact tensor bytes: parameters by dtype, optimizer state, measured on the live objects;
  * process peak resident memory (ru_maxrss) minus the resident memory after imports.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()

    import torch
    from transformers import LlamaForSequenceClassification

    from lightning_rl.cli import DEFAULT_TRAINER_CONFIG, main as cli_main
    from lightning_rl.tiny import build_char_tokenizer, build_tiny_llama

    torch.set_num_threads(2)
    base = rss_mb()
    scratch = Path(tempfile.mkdtemp())
    tokenizer = build_char_tokenizer()
    policy = build_tiny_llama(tokenizer, hidden_size=args.hidden, layers=args.layers, heads=8)
    policy.config.max_position_embeddings = 64
    policy.save_pretrained(scratch / "policy")
    tokenizer.save_pretrained(scratch / "policy")
    config = policy.config
    config.num_labels = 1
    LlamaForSequenceClassification(config).save_pretrained(scratch / "rm")
    tokenizer.save_pretrained(scratch / "rm")
    del policy

    cli = cli_main(
        [
            "--config", DEFAULT_TRAINER_CONFIG, "--config", str(Path(__file__).resolve().parents[1] / "configs/ppo_rlhf.yaml"),
            f"--model.policy.path={scratch / 'policy'}", f"--model.reference.path={scratch / 'policy'}", "--model.reference.dtype=bfloat16",
            f"--model.reward.init_args.path={scratch / 'rm'}", "--model.reward.init_args.dtype=bfloat16",
            "--data.batch_size=2", "--data.val_data=null", "--model.loop.ppo_epochs=1", "--model.loop.num_mini_batches=1",
            "--trainer.max_steps=1", "--trainer.logger=false", "--trainer.callbacks=[]", "--trainer.enable_checkpointing=false",
            f"--trainer.default_root_dir={scratch}", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        ],
        run=False,
    )  # fmt: skip
    module = cli.model
    cli.trainer.fit(module, datamodule=cli.datamodule)
    peak = peak_rss_mb() - base

    trainable = [p for m in (module.policy, module.critic) for p in m.parameters() if p.requires_grad]
    frozen = [p for m in (module.reference, module.reward.model) for p in m.parameters()]
    n_train, n_frozen = sum(p.numel() for p in trainable), sum(p.numel() for p in frozen)
    optimizer = module.optimizers().optimizer
    state_bytes = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    weight_bytes = sum(p.numel() * p.element_size() for p in trainable + frozen)
    grad_bytes = sum(p.numel() * p.element_size() for p in trainable)  # alive between backward and zero_grad
    bill = 16 * n_train + 2 * n_frozen
    exact = weight_bytes + grad_bytes + state_bytes
    mb = 2**20
    print(f"trainable parameters (policy + critic): {n_train:,}; frozen (reference + reward model, bf16): {n_frozen:,}")
    print(f"bill 16 B x trainable + 2 B x frozen:        {bill / mb:8.1f} MB")
    print(f"exact tensors: weights {weight_bytes / mb:.1f} + gradients {grad_bytes / mb:.1f} + Adam state {state_bytes / mb:.1f} = {exact / mb:8.1f} MB")
    print(f"Adam state entries: {len(optimizer.state)} (= trainable tensors: {len(trainable)}); frozen tensors in the optimizer: "
          f"{sum(any(p is q for g in optimizer.param_groups for q in g['params']) for p in frozen)}")  # fmt: skip
    print(f"process peak RSS above post-import baseline: {peak:8.1f} MB ({peak * mb / bill:.2f}x the bill)")


if __name__ == "__main__":
    main()
