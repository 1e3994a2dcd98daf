"""Run one program under limits: isolated by the kernel (`run_isolated`, Linux namespaces), or only bounded (`run_unisolated`).

`run_isolated` starts components/env/namespaces.py, which gives the program a new user, PID, mount, IPC and
UTS namespace and, unless ``network``, a network namespace with no interface up. The program sees a read-only
root holding only the interpreter, ``/usr``, ``/lib*``, the dynamic loader's ``/etc`` files and ``/dev/null``,
``/dev/zero``, ``/dev/full``, ``/dev/random``, ``/dev/urandom``; a ``/proc`` of its own processes; and a fresh
``/tmp`` (a tmpfs of ``scratch_mb``, gone with the program) as its working folder and only writable place.
The trainer's home and working folder are hidden even where they lie under a mounted path. It runs with
no capabilities and no new privileges (a real-root trainer's program is the host's ``nobody``), under a system-call
filter (components.env.syscall_filter: no kernel keyrings, memfds, System V or POSIX IPC, io_uring, and no socket
but a connected Unix pair, or IPv4 and IPv6 ones with ``network``); its processes number at most ``max_processes``,
each with ``memory_mb`` of address space, ``OPEN_FILES`` open files, the CPU time limit and ``OUTPUT_BYTES`` per
file; ``/tmp`` holds at most ``scratch_mb`` and ``SCRATCH_FILES_PER_MB`` files per MiB; at ``timeout_s`` (or when the
program ends) every process it started dies with the PID namespace.

`run_unisolated` is the weaker mode, for machines without user namespaces: the same limits on the program's
own process group (``resource.setrlimit``), nothing else (see `UNISOLATED_EXPOSES`).
"""

from __future__ import annotations

import functools
import json
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

from .syscall_filter import refusal_filter

OUTPUT_BYTES = 1 << 20
"""Most bytes a program may write to one file (its standard output included)."""
OPEN_FILES = 64
"""Most files a sandboxed process may hold open: each pipe or socket pair holds kernel buffers (at their default sizes:
the system-call filter refuses to grow them) that no address-space limit counts."""
SCRATCH_FILES_PER_MB = 64
"""Files the scratch ``/tmp`` may hold per MiB of ``scratch_mb``: an empty file costs about 1 KiB of kernel memory (its
inode and name) that the tmpfs's size does not count."""

LAUNCHER = Path(__file__).with_name("namespaces.py")
SYSTEM_PATHS = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
)
NETWORK_PATHS = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
)  # names and certificates
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
PROGRAM_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
LAUNCH_GRACE_S = 10.0
"""The trainer's own bound past ``timeout_s``, should the launcher itself stall."""
UNISOLATED_EXPOSES = (
    "the program runs with the trainer's user and rights: it can read the trainer's files and secrets (its /proc, "
    "~/.ssh, tokens in the environment of the trainer's process), write and delete files in the working folder "
    "(runs/, checkpoints), use the network (the rollout server's weight-update API on loopback) and signal the trainer"
)


class Outcome(NamedTuple):
    status: str  # "exit" | "signal" | "timeout"
    code: int  # the exit status or the signal number (0 on timeout)
    stdout: str
    stderr: str
    full: frozenset = frozenset()  # the streams ("stdout", "stderr") that reached OUTPUT_BYTES


def run_isolated(
    argv: list[str],
    timeout_s: float,
    memory_mb: int,
    max_processes: int,
    scratch_mb: int,
    network: bool = False,
    max_chars: int = 8000,
    running: set | None = None,
) -> Outcome:
    """``argv`` in the sandbox (module docstring). ``running`` collects the launcher while it runs (to kill it from
    another thread); output is read back as at most ``max_chars`` characters of each stream."""
    limits = {
        "RLIMIT_AS": memory_mb << 20,
        "RLIMIT_CPU": math.ceil(timeout_s) + 1,
        "RLIMIT_FSIZE": OUTPUT_BYTES,
        "RLIMIT_NPROC": max_processes,
        "RLIMIT_NOFILE": OPEN_FILES,
        "RLIMIT_CORE": 0,
    }
    # before anything starts: an unknown machine raises OSError
    program_filter = refusal_filter(os.uname().machine, network)
    status_r, status_w = os.pipe()
    with (
        tempfile.TemporaryDirectory(prefix="sandbox-root-") as root,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
    ):
        spec = {
            "root": root,
            "mounts": mounts(network),
            "devices": [d for d in DEVICES if os.path.exists(d)],
            "scratch_mb": scratch_mb,
            "scratch_files": SCRATCH_FILES_PER_MB * scratch_mb,
            "filter": program_filter.hex(),
            "network": network,
            "argv": argv,
            "env": PROGRAM_ENV,
            "limits": limits,
            "timeout_s": timeout_s,
            "status_fd": status_w,
        }
        try:
            launcher = subprocess.Popen(
                [sys.executable, "-I", "-S", str(LAUNCHER)],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                pass_fds=(status_w,),
                start_new_session=True,
                env={"PATH": PROGRAM_ENV["PATH"]},
            )
        finally:
            os.close(status_w)
        with os.fdopen(status_r, "rb") as status_file:
            if running is not None:
                running.add(launcher)
            try:
                launcher.communicate(json.dumps(spec).encode(), timeout=timeout_s + LAUNCH_GRACE_S)
            except subprocess.TimeoutExpired:
                _kill(launcher)
            finally:
                if running is not None:
                    running.discard(launcher)
            status = status_file.read().decode(errors="replace").splitlines()  # every writer has exited: no wait
        if not status:
            killed = launcher.returncode is not None and launcher.returncode < 0
            raise SandboxError(
                f"the sandbox was killed (signal {-launcher.returncode}): the tool was closed"
                if killed
                else f"the launcher ended with exit status {launcher.returncode}"
            )
        if any(line.startswith("error") for line in status):
            raise SandboxError(next(line for line in status if line.startswith("error")))
        kind, _, code = status[-1].partition(" ")
        return Outcome(kind, int(code or 0), _read(out, max_chars), _read(err, max_chars), _full(out, err))


def run_unisolated(
    argv: list[str], timeout_s: float, memory_mb: int, max_chars: int = 8000, running: set | None = None
) -> Outcome:
    """``argv`` with the trainer's rights, limited by rlimits, in a new session whose process group dies at the end."""

    def limit() -> None:  # in the child, before exec
        for name, value in (
            ("RLIMIT_AS", memory_mb << 20),
            ("RLIMIT_CPU", math.ceil(timeout_s) + 1),
            ("RLIMIT_FSIZE", OUTPUT_BYTES),
        ):
            resource.setrlimit(getattr(resource, name), (value, value))

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            preexec_fn=limit,
            start_new_session=True,
            env={"PATH": os.environ.get("PATH", "")},
        )
        if running is not None:
            running.add(child)
        try:
            child.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill(child)  # the program, or what it left running in its process group
            if running is not None:
                running.discard(child)
        if timed_out:
            return Outcome("timeout", 0, "", "")
        code = child.returncode
        return (
            Outcome("signal", -code, "", _read(err, max_chars), _full(out, err))
            if code < 0
            else Outcome("exit", code, _read(out, max_chars), _read(err, max_chars), _full(out, err))
        )


class SandboxError(RuntimeError):
    """The sandbox could not be built (not the program's failure)."""


@functools.cache
def namespaces_unavailable() -> str | None:
    """Why `run_isolated` cannot run on this machine (None: it can), found by running an empty program once."""
    if not sys.platform.startswith("linux"):
        return f"Linux namespaces are not available on {sys.platform}"
    try:
        outcome = run_isolated(
            [sys.executable, "-I", "-S", "-c", "pass"], timeout_s=30.0, memory_mb=256, max_processes=4, scratch_mb=1
        )
    except (SandboxError, OSError) as err:
        return str(err)
    return None if outcome[:4] == ("exit", 0, "", "") else f"a test program ended with {outcome}"


def kill_all(running: set) -> None:
    """Kill what `run_isolated` / `run_unisolated` are running for other threads (their calls then return at once)."""
    for process in list(running):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:  # already gone
            pass


def _kill(process: subprocess.Popen) -> None:
    kill_all({process})  # a launcher's holder and init follow it (parent-death signal)
    process.wait()


def mounts(network: bool) -> list[tuple[str, str]]:
    """The new root's mounts, parents first: ``("bind", path)`` read-only, what the interpreter needs; ``("hide", path)``
    an empty folder over the trainer's home or working folder where they lie under a bound path (e.g. /usr/src/app)."""
    interpreter = [
        sys.base_prefix,
        sys.base_exec_prefix,
        sys.prefix,
        sys.exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
    ]
    paths = sorted(
        {
            os.path.abspath(p)
            for p in (*SYSTEM_PATHS, *(NETWORK_PATHS if network else ()), *interpreter)
            if os.path.exists(p)
        }
    )
    private = {os.path.abspath(os.path.expanduser("~")), os.getcwd()}
    hidden = sorted(p for p in private if any(_under(p, q) for q in paths))
    # a path below a bound one is visible through it, unless a hidden folder lies between them
    binds = [
        p
        for p in paths
        if not any(_under(p, q) and not any(_under(p, h) and _under(h, q) for h in hidden) for q in paths if q != p)
    ]
    return sorted([("bind", p) for p in binds] + [("hide", p) for p in hidden], key=lambda m: m[1].split("/"))


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _full(out, err) -> frozenset:
    return frozenset(
        name for name, file in (("stdout", out), ("stderr", err)) if file.seek(0, os.SEEK_END) >= OUTPUT_BYTES
    )


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
