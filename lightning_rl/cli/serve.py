"""`lightning-rl serve`: the Tinker API on this machine (lightning_rl.service; docs/tinker-api.md).

    lightning-rl serve --base_models lightning_rl/assets/tiny-arith --api_keys tml-my-local-key
    lightning-rl serve --config serve.yaml                          # the options from a file
    python -m lightning_rl.cli.serve --base_models ... --port 0     # the same command line

Options are `ServeConfig`'s (``lightning-rl serve --help``), from flags or a YAML ``--config``; ``--sampler`` takes a
rollout the way a run's ``model.rollout`` does (``class_path`` and ``init_args``).
"""

from __future__ import annotations

import logging
import os
import sys

from jsonargparse import ActionConfigFile, ArgumentParser, set_parsing_settings

from lightning_rl.service import KEYS_VARIABLE, ServeConfig, serve


def parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="lightning-rl serve",
        description="Serve the Tinker API (the official tinker SDK's training and sampling calls) on local models.",
    )
    parser.add_argument("--config", action=ActionConfigFile, help="a YAML file of these options")
    parser.add_class_arguments(ServeConfig, fail_untyped=True)
    return parser


def main(argv: list[str] | None = None) -> None:
    asked = sys.argv[1:] if argv is None else argv
    # the options' docstrings are their help; reading them costs a second, so only when help is asked for
    set_parsing_settings(docstring_parse_attribute_docstrings=any(a in ("-h", "--help") for a in asked))
    args = parser()
    config = args.instantiate_classes(args.parse_args(argv))
    config.pop("config", None)
    server = serve(ServeConfig(**config))
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("lightning_rl.service").setLevel(logging.INFO)
    models = ", ".join(base.path for base in server.service.bases)
    made = not config["api_keys"] and len(server.keys) == 1 and not os.environ.get(KEYS_VARIABLE)
    key = server.keys[0] if made else "<a key it was given>"  # keys given are never printed
    print(f"lightning-rl serve: the Tinker API on {server.url} ({models})", flush=True)
    print(f"  export TINKER_BASE_URL={server.url} TINKER_API_KEY={key}", flush=True)
    server.run()


if __name__ == "__main__":
    from lightning_rl.cli.commands import command_line

    command_line(main)
