"""`PythonTool`: run the model's Python code in a sandbox (Linux namespaces) with a timeout and limits; answer its output."""

from __future__ import annotations

import sys
import warnings
from typing import Literal

from .sandbox import (
    OUTPUT_BYTES,
    UNISOLATED_EXPOSES,
    Outcome,
    SandboxError,
    kill_all,
    namespaces_unavailable,
    run_isolated,
    run_unisolated,
)
from .tools import Tool, ToolError

STREAMS = {"stdout": "standard output", "stderr": "standard error"}
MAX_PROGRAM_CHARS = 100_000
"""Longest program accepted (one command-line argument of the kernel holds at most 128 KiB)."""


class PythonTool(Tool):
    """Runs the call's text as a Python program (``python -I -c``), sandboxed by default, and answers its standard output.

    The code is the policy's, so untrusted. With ``isolation: namespaces`` (the default) it runs in a sandbox built
    by the kernel (components.env.sandbox): its own user, PID, mount, IPC, UTS, cgroup and network namespaces; a read-only
    root with only the interpreter and system libraries; ``/tmp`` (``scratch_mb``, deleted afterwards) as its
    only writable place; no view of the trainer's processes, files, home, keyring, Unix sockets or network; no
    capabilities; a system-call filter that refuses memory no limit counts and every socket but a connected Unix pair
    (components.env.syscall_filter); ``max_processes`` processes; every one of them killed at ``timeout_s``.
    ``network: true`` shares the host's network (the internet, and every service on loopback, the rollout server's
    included) and lets it open IPv4 and IPv6 sockets (no other family). Where user namespaces
    are not available, construction fails unless ``isolation: none`` opts into the weaker mode: only the limits
    below, with the trainer's rights.

    Limits either way: ``timeout_s`` of wall-clock time, ``memory_mb`` of address space per process, ``timeout_s`` of
    CPU time and ``OUTPUT_BYTES`` per file written, standard output included (output goes to files, so a flood cannot
    fill the trainer's memory or log). A program that exits non-zero, runs out of memory, time or output answers
    an error with the last line of its standard error.
    """

    def __init__(
        self,
        name: str = "python",
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        max_output_chars: int = 2000,
        isolation: Literal["namespaces", "none"] = "namespaces",
        network: bool = False,
        max_processes: int = 32,
        scratch_mb: int = 64,
    ):
        """
        Args:
            name: the tool's name in a call.
            timeout_s: wall-clock seconds a program may run.
            memory_mb: address-space limit of each of its processes, in MiB.
            max_output_chars: standard output beyond this is cut.
            isolation: ``namespaces``: the kernel's sandbox; ``none``: the program runs with the trainer's rights (it can
                read its files and secrets, use the network, signal it); for machines without user namespaces only.
            network: let a sandboxed program use the host's network (loopback services included).
            max_processes: most processes a sandboxed program may run at once, itself included.
            scratch_mb: size of a sandboxed program's ``/tmp``, the only place it can write (memory-backed).
        """
        if timeout_s <= 0 or memory_mb < 32 or max_processes < 1 or scratch_mb < 1:
            raise ValueError(
                f"PythonTool: need timeout_s > 0, memory_mb >= 32, max_processes >= 1 and scratch_mb >= 1, got {timeout_s}, {memory_mb}, {max_processes}, {scratch_mb}"
            )
        if isolation not in ("namespaces", "none"):
            raise ValueError(f"PythonTool: isolation must be namespaces or none, got {isolation!r}")
        if isolation == "namespaces" and (reason := namespaces_unavailable()) is not None:
            raise RuntimeError(
                f"PythonTool cannot isolate the model's code on this machine: {reason}. It needs unprivileged user namespaces "
                "(sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1 or kernel.apparmor_restrict_unprivileged_userns=0, "
                "and a container that allows unshare). Use a remote sandbox (components.env.SandboxFusionTool), or accept running it "
                f"unisolated with isolation: none ({UNISOLATED_EXPOSES})"
            )
        if isolation == "none":
            warnings.warn(f"PythonTool(isolation: none): {UNISOLATED_EXPOSES}. Only trusted code should run this way")
        self.name, self.timeout_s, self.memory_mb, self.max_output_chars = name, timeout_s, memory_mb, max_output_chars
        self.isolation, self.network, self.max_processes, self.scratch_mb = (
            isolation,
            network,
            max_processes,
            scratch_mb,
        )
        self._running: set = set()  # the processes of the calls under way, which close() kills

    def __call__(self, arguments: str) -> str:
        if len(arguments) > MAX_PROGRAM_CHARS:
            raise ToolError(f"program longer than {MAX_PROGRAM_CHARS} characters")
        argv = [sys.executable, "-I", "-c", arguments]
        read = self.max_output_chars * 4
        if self.isolation == "none":
            outcome = run_unisolated(argv, self.timeout_s, self.memory_mb, read, self._running)
        else:
            try:
                outcome = run_isolated(
                    argv,
                    self.timeout_s,
                    self.memory_mb,
                    self.max_processes,
                    self.scratch_mb,
                    self.network,
                    read,
                    self._running,
                )
            except SandboxError as err:
                raise ToolError(str(err)) from None
        return self._answer(outcome)

    def _answer(self, outcome: Outcome) -> str:
        if outcome.status == "timeout":
            raise ToolError(f"timed out after {self.timeout_s} s")
        if outcome.status == "exit" and outcome.code == 0:
            return outcome.stdout[: self.max_output_chars].rstrip("\n")
        what = f"exit status {outcome.code}" if outcome.status == "exit" else f"killed by signal {outcome.code}"
        last = (outcome.stderr.strip().splitlines() or [what])[-1]
        if "MemoryError" in outcome.stderr:
            last = f"MemoryError: more than {self.memory_mb} MiB"
        elif "File too large" in last or outcome.full:
            stream = next((name for name in ("stdout", "stderr") if name in outcome.full), None)
            what = f"the program's {STREAMS[stream]}" if stream else "a file the program wrote"
            last = f"{what} passed {OUTPUT_BYTES} bytes, the limit on each file it writes (File too large)"
        raise ToolError(last[: self.max_output_chars])

    def close(self) -> None:
        kill_all(self._running)
