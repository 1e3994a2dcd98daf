"""`python cli.py fit --config configs/grpo.yaml`: the same CLI as the `lightning-rl` console script (`fit`, `validate`,
`distill`, `sft`, `reward-model`, `export`, `components`, `--dry_run`), without installing it."""

from lightning_rl.command import entry

if __name__ == "__main__":
    entry()
