"""`PythonTool`: run the model's Python code in a child process with a wall-clock timeout and a memory limit."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys

from .tools import Tool, ToolError


class PythonTool(Tool):
    """Runs the call's text as a Python program (``python -I``, in a new session) and answers its standard output.

    Limits: ``timeout_s`` of wall-clock time (then the whole process group is killed), ``memory_mb`` of address
    space and ``timeout_s`` of CPU time (``resource.setrlimit`` in the child). A program that exits non-zero,
    runs out of memory or time answers an error with the last line of its standard error. This bounds a
    runaway program; it is not a security sandbox (the code can read files and use the network).
    """

    def __init__(self, name: str = "python", timeout_s: float = 5.0, memory_mb: int = 512, max_output_chars: int = 2000):
        """
        Args:
            name: the tool's name in a call.
            timeout_s: wall-clock seconds a program may run.
            memory_mb: address-space limit of the program, in MiB.
            max_output_chars: standard output beyond this is cut.
        """
        if timeout_s <= 0 or memory_mb < 32:
            raise ValueError(f"PythonTool: need timeout_s > 0 and memory_mb >= 32, got {timeout_s}, {memory_mb}")
        self.name, self.timeout_s, self.memory_mb, self.max_output_chars = name, timeout_s, memory_mb, max_output_chars

    def _limits(self) -> None:  # in the child, before exec
        limit = self.memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        cpu = max(1, int(self.timeout_s) + 1)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))

    def __call__(self, arguments: str) -> str:
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": "0"}
        child = subprocess.Popen(
            [sys.executable, "-I", "-c", arguments], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=self._limits, start_new_session=True, env=env, text=True,
        )
        try:
            out, err = child.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)  # the program and anything it started
            child.communicate()
            raise ToolError(f"timed out after {self.timeout_s} s") from None
        if child.returncode != 0:
            last = (err.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
            if "MemoryError" in err:
                last = f"MemoryError: more than {self.memory_mb} MiB"
            raise ToolError(last[: self.max_output_chars])
        return out[: self.max_output_chars].rstrip("\n")
