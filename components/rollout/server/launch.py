"""Launching an inference server as a child process, waiting until it answers its health check, stopping it.

An engine pins its own torch (and CUDA stack), so ``python`` is usually the interpreter of a separate environment that
has the engine installed. The server and the processes it spawns (scheduler, detokenizer, engine core) share a new
process group, which `LaunchedServer.close` terminates as a whole; a watchdog (`watchdog`) terminates it when the
trainer dies without closing it (SIGKILL).

A launched server must be the one started here before anything is sent to it: a port another process listens on
(another run's server) is refused before the launch, and once the port answers, the socket listening on it must belong
to the launched process group (Linux: ``/proc/net/tcp*`` and ``/proc/<pid>/fd``), or the answer came from another
server, which would be sampled and sent this run's weights.
"""

from __future__ import annotations

import atexit
import errno
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import watchdog
from .http import HTTPClient, ServerError


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


@dataclass(frozen=True)
class Command:
    """How to start one server: its argv, the environment variables it adds, where it will listen and what answers
    once it is ready."""

    argv: list[str]
    url: str
    health_path: str
    env: dict[str, str] = field(default_factory=dict)


class LaunchedServer:
    """One server started by the rollout; ``url`` is where it listens."""

    def __init__(self, command: Command, client: type[HTTPClient], log_dir: str | None = None, owner: str = "rollout"):
        """``owner``: what started it (``rollout``, ``teacher``), as messages say."""
        self.command, self.url, self._client, self.owner = command, command.url, client, owner
        engine = client.error.engine
        port = command.url.rsplit(":", 1)[-1]
        folder = log_dir or tempfile.mkdtemp(prefix=f"lightning_rl_{engine.lower()}_")
        self.log_path = Path(folder) / f"{engine.lower()}_{port}.log"
        taken = port_taken(command.url)
        if taken:
            raise client.error(
                f"{engine} server at {command.url}: another process already listens on port {port} (another run's "
                f"server?), and the {owner} would sample there and push its weights into it. Leave launch.port out (a "
                "free port is picked) or choose a free one"
            )
        self._log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen(
                command.argv,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **command.env},
            )
        except OSError as err:
            self._log.close()
            raise client.error(
                f"could not start the {engine} server ({' '.join(command.argv)}): {err}. "
                f"Set servers.launch_python to an interpreter with {engine} installed."
            ) from err
        self.watchdog = watchdog.watch(self.process.pid)
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
        return (
            f"The {self._client.error.engine} server launched by the {self.owner} exited with code {code}; "
            f"log {self.log_path}, last lines:\n{self.log_tail()}"
        )

    def wait_ready(self, timeout_s: float) -> None:
        """Poll ``GET <health_path>`` until it answers 200."""
        deadline = time.monotonic() + timeout_s
        probe = self._client(timeout_s=30.0, max_retries=0, backoff=0.0)
        path = self.command.health_path
        while True:
            note = self.death_note()
            if note is not None:
                raise probe.fail(self.url, f" did not start. {note}")
            try:
                probe.request(self.url, path, method="GET")
            except ServerError:
                if time.monotonic() > deadline:
                    raise probe.fail(
                        self.url,
                        f" did not answer {path} within servers.launch_timeout_s={timeout_s}; "
                        f"log {self.log_path}, last lines:\n{self.log_tail()}",
                    ) from None
                time.sleep(1.0)
                continue
            if listens_here(self.url, self.process.pid) is False:
                raise probe.fail(
                    self.url,
                    f" answered {path}, but the process listening on it is not the server the {self.owner} launched "
                    "(another run's server took the port first?): nothing was sent to it. Leave launch.port out (a free "
                    f"port is picked) or choose a free one; log {self.log_path}",
                )
            return

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
        watchdog.stop(self.watchdog)
        self._log.close()
        atexit.unregister(self.close)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _address(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "127.0.0.1", int(parts.port or 80)


def port_taken(url: str) -> bool:
    """Whether a process already listens on ``url``'s port on this machine (a bind with SO_REUSEADDR, as servers do,
    fails only then); False for an address this machine cannot bind (another host's)."""
    host, port = _address(url)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            return err.errno == errno.EADDRINUSE
    return False


def listens_here(url: str, group: int) -> bool | None:
    """Whether the socket listening on ``url``'s port belongs to a process of process group ``group`` (None: this
    system cannot tell, no ``/proc``)."""
    _, port = _address(url)
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    if not Path("/proc/net/tcp").exists():
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != group:
                continue
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                return True
        except OSError:  # gone, or not ours to read
            continue
    return False
