"""`lightning-rl` and `python cli.py`: the command line (fit, validate, distill, sft, reward-model, export, components,
--dry_run), the progress bar and the run folders."""

from lightning_rl.cli.commands import DEFAULT_TRAINER_CONFIG, entry, main

__all__ = ["DEFAULT_TRAINER_CONFIG", "entry", "main"]
