"""`lightning-rl export CKPT OUT_DIR`: the command line of lightning_rl.export (a checkpoint's models as Hugging Face
folders).

    lightning-rl export runs/grpo/latest/checkpoints/last.ckpt runs/grpo/hf --dtype bfloat16
    python -m lightning_rl.cli.export runs/grpo/latest/checkpoints/last.ckpt runs/grpo/hf
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lightning_rl.export import export_checkpoint


def main(argv: list[str] | None = None) -> dict[str, Path]:
    parser = argparse.ArgumentParser(
        prog="lightning-rl export", description="Write the models of a checkpoint in Hugging Face format."
    )
    parser.add_argument(
        "checkpoint", help="a .ckpt file, an FSDP2Strategy checkpoint folder or a DeepSpeed checkpoint folder"
    )
    parser.add_argument("out_dir", help="writes policy/ (and critic/, or reward_model/) here")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default=None,
        help="cast the weights (default: as trained)",
    )
    parser.add_argument(
        "--tokenizer", default=None, help="tokenizer path (default: the policy's path recorded in the checkpoint)"
    )
    parser.add_argument(
        "--adapter_only",
        action="store_true",
        help="LoRA runs: write the adapters (peft format) instead of merged full models",
    )
    args = parser.parse_args(argv)
    written = export_checkpoint(args.checkpoint, args.out_dir, args.dtype, args.tokenizer, args.adapter_only)
    for name, folder in written.items():
        print(f"{name}: {folder}")
    return written


if __name__ == "__main__":
    main()
