"""SandboxFusionTool against a loopback stand-in of SandboxFusion's ``POST /run_code``: the request in SandboxFusion's
field names, and each kind of answer (success, a failing program, a timeout, a sandbox error, no server) as the model reads it."""

from __future__ import annotations

import socket

import pytest

from components.env import SandboxFusionTool, ToolEnvironment, ToolError
from lightning_rl.core.contracts import Turn
from tests.fixtures.sandbox_fusion_server import FakeSandboxFusion


@pytest.fixture
def server():
    fake = FakeSandboxFusion()
    yield fake
    fake.close()


def test_a_program_runs_on_the_server(server):
    tool = SandboxFusionTool(url=server.url + "/", timeout_s=3.0, memory_mb=256, max_output_chars=5)
    assert tool("print(6 * 7)") == "42"
    assert server.requests == [
        {
            "code": "print(6 * 7)",
            "language": "python",
            "run_timeout": 3.0,
            "compile_timeout": 3.0,
            "memory_limit_MB": 256,
        }
    ]
    assert tool("print('y' * 50)") == "yyyyy"


def test_the_programs_failures_are_the_models_to_read(server):
    tool = SandboxFusionTool(url=server.url, timeout_s=1.0)
    with pytest.raises(ToolError, match=r"^ZeroDivisionError: division by zero$"):
        tool("1/0")
    with pytest.raises(ToolError, match=r"^exit status 3$"):
        tool("import sys; sys.exit(3)")
    with pytest.raises(ToolError, match=r"^timed out after 1.0 s$"):
        tool("while True: pass")
    env = ToolEnvironment([SandboxFusionTool(url=server.url)])
    step = env.step(None, Turn([], "<call>python(print(1 + 1))</call>", "stop", 0))
    assert step.observation == "<result>2</result>" and step.tool_errors == 0


def test_a_failing_server_is_named_and_warned_about_once(server):
    tool = SandboxFusionTool(url=server.url)
    server.sandbox_error = "runner crashed"
    with pytest.warns(UserWarning, match="tool calls answer errors to the model until it works"):
        with pytest.raises(
            ToolError, match=rf"the SandboxFusion server at {server.url} answered 'SandboxError': runner crashed"
        ):
            tool("print(1)")
    with pytest.raises(ToolError, match="runner crashed"):  # warned once
        tool("print(1)")
    with pytest.warns(UserWarning), pytest.raises(ToolError, match="refused the request with HTTP 422"):
        SandboxFusionTool(url=server.url, language="cobol")("x")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with (
        pytest.warns(UserWarning),
        pytest.raises(
            ToolError, match=rf"the SandboxFusion server at {nowhere} could not be reached \(.*Connection refused"
        ),
    ):
        SandboxFusionTool(url=nowhere)("print(1)")
    with pytest.raises(ValueError, match="url must start with http"):
        SandboxFusionTool(url="sandbox:8080")
