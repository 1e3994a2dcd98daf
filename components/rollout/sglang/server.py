"""Launching ``python -m sglang.launch_server`` as a child process, waiting until it generates, stopping it.

SGLang pins its own torch and CUDA stack, so ``python`` is usually the interpreter of a separate
environment that has sglang installed. The server and the processes it spawns (scheduler,
detokenizer) share a new process group, which `LaunchedServer.close` terminates as a whole.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from .client import SGLangClient, SGLangError


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def server_argv(args: dict[str, Any]) -> list[str]:
    """``{"model_path": p, "enable_memory_saver": True}`` -> ``["--model-path", p, "--enable-memory-saver"]``.

    ``True`` is a bare flag, ``False``/``None`` leave the flag out, a list gives one value each.
    """
    argv: list[str] = []
    for key, value in args.items():
        flag = "--" + str(key).replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


class LaunchedServer:
    """One SGLang server started by the rollout; ``url`` is where it listens."""

    def __init__(self, args: dict[str, Any], python: str, log_dir: str | None = None):
        args = dict(args)
        if not args.get("model_path"):
            raise ValueError(
                "SGLangRollout: launch needs model_path, the checkpoint the server loads "
                "(e.g. launch: {model_path: ${model.policy.path}, mem_fraction_static: 0.5})"
            )
        args.setdefault("host", "127.0.0.1")
        args.setdefault("port", free_port(args["host"]))
        self.url = f"http://{args['host']}:{args['port']}"
        self.argv = [python, "-m", "sglang.launch_server", *server_argv(args)]
        self.log_path = Path(log_dir or tempfile.mkdtemp(prefix="lightning_rl_sglang_")) / f"sglang_{args['port']}.log"
        self._log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen(
                self.argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as err:
            self._log.close()
            raise SGLangError(
                f"could not start the SGLang server ({' '.join(self.argv)}): {err}. Set launch_python to an interpreter with sglang installed."
            ) from err
        atexit.register(self.close)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def death_note(self) -> str | None:
        """Why the server is gone (exit code and log tail), or None while its process runs."""
        code = self.process.poll()
        if code is None:
            return None
        return f"The SGLang server launched by SGLangRollout exited with code {code}; log {self.log_path}, last lines:\n{self.log_tail()}"

    def wait_ready(self, timeout_s: float) -> None:
        """Poll ``GET /health_generate`` (it runs a one-token generation) until it answers 200."""
        deadline = time.monotonic() + timeout_s
        probe = SGLangClient(timeout_s=30.0, max_retries=0, backoff=0.0)
        while True:
            note = self.death_note()
            if note is not None:
                raise SGLangError(f"the SGLang server at {self.url} did not start. {note}")
            try:
                probe.request(self.url, "/health_generate", method="GET")
                return
            except SGLangError:
                if time.monotonic() > deadline:
                    raise SGLangError(
                        f"the SGLang server at {self.url} did not answer /health_generate within launch_timeout_s={timeout_s}; "
                        f"log {self.log_path}, last lines:\n{self.log_tail()}"
                    ) from None
            time.sleep(1.0)

    def close(self, grace_s: float = 30.0) -> None:
        """SIGTERM to the whole process group, SIGKILL to what is left after ``grace_s`` seconds."""
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.process.pid, signal.SIGKILL)  # stragglers (scheduler, detokenizer)
        self.process.wait()
        self._log.close()
        atexit.unregister(self.close)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
