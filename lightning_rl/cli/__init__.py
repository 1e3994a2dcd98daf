"""The command line under `lightning-rl` (lightning_rl.command): fit, validate, --dry_run, export, components; the
progress bar and the run folders."""

from lightning_rl.cli.commands import DEFAULT_TRAINER_CONFIG, main

__all__ = ["DEFAULT_TRAINER_CONFIG", "main"]
