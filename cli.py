"""`python cli.py fit --config configs/grpo.yaml`: the same CLI as the `lightning-rl` console script (`fit`, `validate`,
`--dry_run`, `export`, `components`), without installing it."""

from lightning_rl.cli import entry

if __name__ == "__main__":
    entry()
