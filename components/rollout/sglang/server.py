"""Launching SGLang: ``python -m sglang.launch_server`` with the rollout's ``launch`` arguments as flags; ready once
``/health_generate`` answers (it runs a one-token generation)."""

from __future__ import annotations

from typing import Any

from ..server.launch import Command, LaunchedServer, free_port, server_argv

__all__ = ["LaunchedServer", "command", "free_port", "server_argv"]


def command(launch: dict[str, Any], python: str) -> Command:
    args = dict(launch)
    if not args.get("model_path"):
        raise ValueError(
            "SGLangRollout: launch needs model_path, the checkpoint the server loads "
            "(e.g. launch: {model_path: ${model.policy.path}, mem_fraction_static: 0.5})"
        )
    args.setdefault("host", "127.0.0.1")
    args.setdefault("port", free_port(args["host"]))
    return Command(
        [python, "-m", "sglang.launch_server", *server_argv(args)],
        f"http://{args['host']}:{args['port']}",
        "/health_generate",
    )
