"""The tiers of the suite: `make test-fast` runs the unit tests (``-m "not slow and not server"``), `make test` all.

A test says by its markers what it needs, and the guard here checks that against what the test did, so a new test that
trains or serves without saying so fails in every tier instead of quietly slowing the fast one:

- ``slow``: a run end to end: a ``Trainer.fit`` that takes a training step in the test's process (one that stops at a
  user mistake before its first step is a unit test of that error), a Python module (``python -m ...``: the CLI, a
  distributed launch, a launched server) or the repository's ``cli.py`` in another process, or ``torch.multiprocessing``
  ranks;
- ``server``: something listening on a port in the test's process (the loopback SGLang server, the agents' endpoint).

The guard only watches: every call goes through unchanged, and the test fails after its setup or its call, naming the
marker it lacks (a session or module fixture that trains counts for the first test that asks for it)."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

PACKAGE_HELPERS = [Path(__file__).resolve().parents[2] / folder for folder in ("components", "lightning_rl")]
_allowed: frozenset[str] = frozenset()
_seen: list[str] | None = None  # what the running test did that its markers do not allow (None: no test runs)


def _note(marker: str, what: str) -> None:
    seen = _seen
    if seen is not None and marker not in _allowed and what not in seen:
        seen.append(what)


def _watch(owner, name: str, marker: str, what) -> None:
    """Wrap ``owner.name``: each call first asks ``what(*args, **kwargs)`` for a description (None: nothing to note)."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def watched(*args, **kwargs):
        described = what(*args, **kwargs)
        if described:
            _note(marker, f"{described}: mark it @pytest.mark.{marker}")
        return original(*args, **kwargs)

    setattr(owner, name, watched)


def _watch_fit(trainer_class) -> None:
    original = trainer_class.fit

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        finally:
            if self.global_step > 0:
                _note("slow", "Trainer.fit took a training step: mark it @pytest.mark.slow")

    trainer_class.fit = fit


def _python_program(self, args=(), *rest, **kwargs) -> str | None:
    """``python -m module`` or ``python script.py`` (a launched CLI, rank, server, benchmark or script), else None: code
    given with ``-c`` and the package's own helper programs (a tool's worker, the sandbox's launcher) are not runs."""
    words = [os.fspath(w) for w in args] if isinstance(args, (list, tuple)) else str(args).split()
    if not any(os.path.basename(w).startswith("python") for w in words):
        return None
    words = words[: words.index("-c")] if "-c" in words else words  # what follows is the code and its arguments
    if "-m" in words[:-1]:
        return f"runs `python -m {words[words.index('-m') + 1]}` in another process"
    scripts = [w for w in words if w.endswith(".py") and not any(Path(w).is_relative_to(h) for h in PACKAGE_HELPERS)]
    return f"runs `python {scripts[0]}` in another process" if scripts else None


def _on_a_port(sock: socket.socket, *args) -> str | None:
    # not a Unix socket (multiprocessing shares tensors' file descriptors through one)
    return "listens on a port" if sock.family in (socket.AF_INET, socket.AF_INET6) else None


def install() -> None:
    """Put the watches in place (once per process: pytest_configure)."""
    import torch.multiprocessing
    from lightning.pytorch import Trainer

    _watch_fit(Trainer)
    _watch(subprocess.Popen, "__init__", "slow", _python_program)
    _watch(torch.multiprocessing, "spawn", "slow", lambda *a, **k: "torch.multiprocessing.spawn")
    _watch(torch.multiprocessing, "start_processes", "slow", lambda *a, **k: "torch.multiprocessing.start_processes")
    _watch(socket.socket, "listen", "server", _on_a_port)


SERVING_FIXTURES = {"server", "loopback"}
"""Fixtures that start a server: the tests that ask for one are marked ``server``."""


def arrange(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that ask for a serving fixture; under pytest-xdist (``--dist loadgroup``) put the tests that
    share a module's fixture (a run, two servers) in one group, so one worker builds it once while every other test
    goes to whichever worker is free; and order the files with end-to-end runs first (each file's tests keep their
    order), so the workers end together on short tests rather than one of them on a minute-long run."""
    grouping = config.pluginmanager.hasplugin("xdist")
    for item in items:
        if SERVING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker("server")
        fixtures = getattr(item, "_fixtureinfo", None)
        scopes = {defs[-1].scope for defs in fixtures.name2fixturedefs.values()} if fixtures else set()
        if grouping and scopes & {"package", "module", "class"} and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    heavy = {item.path for item in items if item.get_closest_marker("slow") or item.get_closest_marker("server")}
    items.sort(key=lambda item: item.path not in heavy)


@contextmanager
def watching(item: pytest.Item):
    """Around one phase of ``item``: fail it if it did what its markers do not allow."""
    global _allowed, _seen
    _allowed = frozenset(marker.name for marker in item.iter_markers())
    _seen = []
    try:
        yield
    finally:
        seen, _seen = _seen, None
    if seen:
        pytest.fail(
            f"{item.nodeid} {'; '.join(seen)} (the markers keep it out of `make test-fast`: tests/support/tiers.py)",
            pytrace=False,
        )
