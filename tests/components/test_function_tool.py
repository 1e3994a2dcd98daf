"""FunctionTool calls run in a worker process: a call that never returns ends at its timeout on any thread, in Python
or C code; close() ends a call under way; nothing the function prints reaches the trainer's log."""

from __future__ import annotations

import threading
import time

import pytest

from components.env import FunctionTool
from tests.fixtures.tools import echo_or_hang
from tests.support.tools import attempt, check_what_a_tool_prints_never_reaches_the_trainers_log, on_a_thread


@pytest.mark.parametrize("how", ["hang", "spin"])
def test_a_call_that_never_returns_ends_at_its_timeout_on_any_thread(how):
    tool = FunctionTool(echo_or_hang, timeout_s=1.0)
    try:
        assert tool("warm") == "WARM"  # the worker is up: what follows times the call alone
        start = time.monotonic()
        assert on_a_thread(lambda: attempt(tool, how)) == ["error: no answer within 1.0 s"]
        assert time.monotonic() - start < 3.0
        start = time.monotonic()
        assert attempt(tool, how) == "error: no answer within 1.0 s"  # on the main thread too (C code ignores SIGALRM)
        assert time.monotonic() - start < 3.0
        assert tool("again") == "AGAIN"  # a new worker answers the next call
    finally:
        tool.close()


def test_close_ends_a_call_under_way():
    tool = FunctionTool(echo_or_hang, timeout_s=None)
    assert tool("warm") == "WARM"
    threading.Timer(0.5, tool.close).start()
    (answer,) = on_a_thread(lambda: attempt(tool, "hang"), join_s=10.0)
    assert answer == "error: the tool's process ended during the call (killed by signal 9)"


def test_what_a_tool_prints_never_reaches_the_trainers_log(capfd):
    check_what_a_tool_prints_never_reaches_the_trainers_log(capfd)


def test_the_function_must_be_importable():
    with pytest.raises(ValueError, match="define it at the top level of a module"):
        FunctionTool(lambda text: text)

    def script_function(text):
        return text

    script_function.__module__ = script_function.__qualname__ = "__main__"  # as if defined in the script being run
    with pytest.raises(ValueError, match="define it at the top level of a module"):
        FunctionTool(script_function)


def test_calls_made_at_once_run_at_once_in_max_workers_each_bounded_by_its_timeout():
    from tests.fixtures.tools import slow_echo

    tool = FunctionTool(slow_echo, timeout_s=2.0, max_workers=3)
    try:
        on_a_thread(lambda: [tool("warm") for _ in range(1)])
        start = time.monotonic()
        answers = {}
        threads = [
            threading.Thread(target=lambda k=k: answers.__setitem__(k, attempt(tool, k)))
            for k in ["a", "b", "c", "hang"]
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(15)
        elapsed = time.monotonic() - start
        assert answers == {"a": "a", "b": "b", "c": "c", "hang": "error: no answer within 2.0 s"}  # each its own
        # three workers: a, b, c and the hanging call's first 0.4 s overlap; one after another would take 3.2 s
        assert elapsed < 3.0
        assert len(tool._idle) <= 3 and not tool._busy  # the hung call's worker was killed, not kept
        start = time.monotonic()
        assert on_a_thread(lambda: [attempt(tool, k) for k in "xy"]) == [["x", "y"]]
    finally:
        tool.close()
    assert not tool._idle
