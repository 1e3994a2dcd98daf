"""`FunctionTool`: any Python function as a tool, called in a worker process that is killed when a call runs past its timeout."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable

from lightning_rl.core import untrusted_json

from .tools import Tool, ToolError

WORKER = Path(__file__).with_name("tool_worker.py")
STARTUP_S = 120.0
"""Most seconds a worker may take to import the function's module (not counted in a call's timeout)."""


class FunctionTool(Tool):
    """Any Python function as a tool: ``fn(**arguments)`` when the argument text is a JSON object, else ``fn(text)``.

    In YAML ``fn`` is a dotted import path (``my_project.tools.lookup``). Calls run in worker processes of this
    tool (components/env/tool_worker.py), started as calls need them with the trainer's ``sys.path`` and
    environment, one call at a time each: calls made at once (the episodes of a round, MultiTurnRollout's
    ``max_concurrent_tools``) run at once, at most ``max_workers``, the others wait for a worker. A call still
    running after ``timeout_s`` (its own time, not the wait) is killed with its worker, whatever it is stuck in
    and on whichever thread the call was made (asynchronous rollouts call tools on a background thread), and a
    later call starts a new worker. What the function prints goes nowhere (never to the trainer's
    log); its return value is the result, as ``str(value)``. ``fn`` must be importable, i.e. defined at a
    module's top level (or a picklable callable object). Trusted code: it runs with the trainer's rights
    (for the model's own code use `PythonTool`).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str | None = None,
        timeout_s: float | None = 10.0,
        max_workers: int | None = None,
    ):
        """
        Args:
            fn: the function (or its dotted import path).
            name: the tool's name in a call (None = the function's name).
            timeout_s: seconds one call may take (None = no limit).
            max_workers: worker processes at most, i.e. calls running at once (None = components.env.tool_concurrency()).
        """
        from .concurrency import tool_concurrency

        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"FunctionTool: timeout_s must be > 0 (or null), got {timeout_s}")
        if max_workers is not None and max_workers < 1:
            raise ValueError(f"FunctionTool: max_workers must be >= 1 (or null), got {max_workers}")
        try:
            pickle.dumps(fn)
            if (
                getattr(fn, "__module__", type(fn).__module__) == "__main__"
            ):  # the worker's __main__ is not the trainer's script
                raise ValueError("it is defined in the script being run")
        except Exception as err:
            raise ValueError(
                f"FunctionTool: {fn!r} cannot be sent to the tool's worker process ({err}); define it at the top level of a "
                "module and pass it (or its dotted path, fn: my_project.tools.lookup)"
            ) from None
        self.fn, self.timeout_s = fn, timeout_s
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.max_workers = max_workers or tool_concurrency()
        self._idle: list[_Worker] = []  # started, waiting for a call
        self._busy: set[_Worker] = set()  # each running one call
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(self.max_workers)

    def __call__(self, arguments: str) -> str:
        try:
            parsed = untrusted_json.loads(arguments) if arguments.strip().startswith("{") else None
        except ValueError as err:  # the model's text: nested past untrusted_json.MAX_DEPTH, 1e999, or not JSON
            raise ToolError(
                f"arguments are not valid JSON: {err.msg if isinstance(err, json.JSONDecodeError) else err}"
            ) from None
        message = ("kwargs", parsed) if isinstance(parsed, dict) else ("text", arguments)
        with self._slots:
            worker = self._take()
            try:
                worker.calls.send(message)
                answered = worker.answers.poll(self.timeout_s)
                status, value = worker.answers.recv() if answered else ("timeout", None)
            except (EOFError, OSError):  # the worker died (or close() killed it) during the call
                status, value = "died", worker.kill()
            self._give_back(worker, keep=status not in ("timeout", "died"))
        if status in ("timeout", "died"):
            raise ToolError(
                f"no answer within {self.timeout_s} s"
                if status == "timeout"
                else f"the tool's process ended during the call ({value})"
            )
        if status == "error":
            raise ToolError(value)
        return value

    def _take(self) -> _Worker:
        """An idle worker that is alive, or a new one (started outside the lock: other calls go on meanwhile)."""
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    self._busy.add(worker)
                    return worker
        worker = _Worker(self.fn)
        with self._lock:
            self._busy.add(worker)
        return worker

    def _give_back(self, worker: _Worker, keep: bool) -> None:
        with self._lock:
            self._busy.discard(worker)
            if keep and worker.alive():
                self._idle.append(worker)
                return
        worker.kill()

    def close(self) -> None:
        """Kill the workers (a call under way on another thread answers an error at once)."""
        with self._lock:
            workers = [*self._idle, *self._busy]
            self._idle.clear()
        for worker in workers:
            worker.kill()


class _Worker:
    """A tool_worker.py process and its two pipes."""

    def __init__(self, fn: Callable[..., Any]):
        calls_r, calls_w = os.pipe()
        answers_r, answers_w = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), str(calls_r), str(answers_w)],
            pass_fds=(calls_r, answers_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C is the trainer's
        )
        os.close(calls_r)
        os.close(answers_w)
        self._reaping = (
            threading.Lock()
        )  # a pid is killed only before it is reaped (after, it may be another process's)
        self.calls, self.answers = Connection(calls_w, readable=False), Connection(answers_r, writable=False)
        try:
            self.calls.send(sys.path)
            self.calls.send(fn)
            ready = self.answers.poll(STARTUP_S)
            status, value = self.answers.recv() if ready else ("error", f"not started within {STARTUP_S} s")
        except (EOFError, OSError):
            status, value = "error", self.kill()
        if status != "ready":
            self.kill()
            raise ToolError(f"the tool's function could not be loaded in its worker process: {value}")

    def alive(self) -> bool:
        with self._reaping:
            return self.process.poll() is None

    def kill(self) -> str:
        """Kill the worker and what it started (from any thread; the pipes close when it is dropped); returns how it ended."""
        with self._reaping:
            if self.process.returncode is None:
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except OSError:  # already gone
                    pass
            code = self.process.wait()
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"
