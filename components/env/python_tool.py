"""`PythonTool`: run the model's Python code in a child process with a wall-clock timeout and a memory limit."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile

from .tools import Tool, ToolError

OUTPUT_BYTES = 1 << 20
"""Most bytes a program may write to one file (its standard output included)."""


class PythonTool(Tool):
    """Runs the call's text as a Python program (``python -I``, in a new session) and answers its standard output.

    Limits: ``timeout_s`` of wall-clock time (then the whole process group is killed), ``memory_mb`` of address
    space, ``timeout_s`` of CPU time and ``OUTPUT_BYTES`` per file written, standard output included
    (``resource.setrlimit`` in the child; the output goes to files, so a program that floods it cannot fill the
    trainer's memory). A program that exits non-zero, runs out of memory, time or output answers an error
    with the last line of its standard error; whatever it left running is killed with it. This bounds a
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
        resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_BYTES, OUTPUT_BYTES))

    def __call__(self, arguments: str) -> str:
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": "0"}
        with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
            child = subprocess.Popen(
                [sys.executable, "-I", "-c", arguments], stdin=subprocess.DEVNULL, stdout=out_file, stderr=err_file,
                preexec_fn=self._limits, start_new_session=True, env=env,
            )
            try:
                child.wait(timeout=self.timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            try:
                os.killpg(child.pid, signal.SIGKILL)  # the program, or what it left running
            except OSError:  # nothing left in its process group
                pass
            child.wait()
            if timed_out:
                raise ToolError(f"timed out after {self.timeout_s} s")
            out, err = (_read(f, self.max_output_chars * 4) for f in (out_file, err_file))
        if child.returncode != 0:
            last = (err.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
            if "MemoryError" in err:
                last = f"MemoryError: more than {self.memory_mb} MiB"
            elif "File too large" in last:
                last = f"output larger than {OUTPUT_BYTES} bytes"
            raise ToolError(last[: self.max_output_chars])
        return out[: self.max_output_chars].rstrip("\n")


def _read(file, limit: int) -> str:
    """The first ``limit`` bytes of ``file`` as text; for a larger file, its first and last ``limit // 2`` bytes
    (an error's last line is at the end)."""
    size = file.seek(0, os.SEEK_END)
    file.seek(0)
    if size <= limit:
        data = file.read()
    else:
        head = file.read(limit // 2)
        file.seek(size - limit // 2)
        data = head + b"\n" + file.read()
    return data.decode("utf-8", errors="replace")
