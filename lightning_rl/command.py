"""`lightning-rl`: one command, a subcommand per job. fit, validate, replay and --dry_run are the CLI's (lightning_rl.cli);
distill is fit on configs/distill.yaml; sft and reward-model are the recipes' programs; export, components, rollouts
and serve (the Tinker API service, lightning_rl.service) are the CLI's own. Above the CLI and the recipes: neither
imports it."""

from __future__ import annotations

import sys
from pathlib import Path

from lightning_rl.cli.commands import command_line, main

DISTILL_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "distill.yaml"
"""`lightning-rl distill`'s base config: the repository's configs/distill.yaml (an editable install's checkout)."""


def entry() -> None:
    """The ``lightning-rl`` console script and ``python cli.py``."""
    command_line(_lightning_rl)


def _lightning_rl() -> None:
    command, rest = sys.argv[1:2], sys.argv[2:]
    if command == ["export"]:  # not a Trainer subcommand: checkpoint -> Hugging Face folders
        from lightning_rl.cli.export import main as export

        export(rest)
    elif command == ["serve"]:  # the Tinker API for the official SDK's training and sampling calls
        from lightning_rl.cli.serve import main as serve

        serve(rest)
    elif command == ["components"]:  # every component a config can name, with its formula's first line
        from lightning_rl.cli.catalog import main as components

        components()
    elif command == ["rollouts"]:  # a rollout record's iterations and samples (lightning_rl.rollouts)
        from lightning_rl.cli.rollouts import main as rollouts

        rollouts(rest)
    elif command == ["replay"]:  # fit from a rollout record; the record's config.yaml unless --config is given
        from lightning_rl.cli.replay import with_recorded_config

        _as_argv(["replay", *with_recorded_config(rest)])
        main()
    elif command == ["sft"]:
        from lightning_rl.recipes.sft import main as sft

        _as_argv(_fit_unless_validate(rest))  # LightningCLI reads sys.argv (given args beside it, it warns)
        sft(prog="lightning-rl sft")
    elif command == ["reward-model"]:
        from lightning_rl.recipes.reward_model import main as reward_model

        _as_argv(_fit_unless_validate(rest))
        reward_model(prog="lightning-rl reward-model")
    elif command == ["distill"]:
        if not DISTILL_CONFIG.is_file():
            raise FileNotFoundError(
                f"lightning-rl distill starts from {DISTILL_CONFIG}, which this installation lacks: install lightning-rl "
                "from its repository (pip install -e .), or run lightning-rl fit --config <your copy of distill.yaml>"
            )
        _as_argv(["fit", "--config", str(DISTILL_CONFIG), *rest])
        main()
    else:
        main()


def _as_argv(args: list[str]) -> None:
    sys.argv[1:] = args


def _fit_unless_validate(args: list[str]) -> list[str]:
    """A recipe's arguments with its Trainer subcommand: ``fit`` unless ``fit`` or ``validate`` comes first
    (``lightning-rl sft --config configs/sft.yaml`` trains)."""
    return args if args[:1] in (["fit"], ["validate"]) else ["fit", *args]


if __name__ == "__main__":
    entry()
