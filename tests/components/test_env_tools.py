"""Tools and the tool environment: a call that raises, sleeps past its timeout, allocates past its memory limit,
names no tool or is malformed answers an error observation (within its timeout), never an exception."""

import time

import pytest

from components.env import Calculator, FunctionTool, PythonTool, ToolEnvironment, ToolError, ToolProtocol
from lightning_rl.core.contracts import Step, Turn


def _turn(text: str, finish: str = "stop") -> Turn:
    return Turn(ids=[], text=text, finish=finish, index=0)


@pytest.mark.parametrize(
    "expression, result",
    [
        ("123*45", "5535"),
        ("2 + 3 * (4 - 1)", "11"),
        ("7/2", "3.5"),
        ("6/3", "2"),
        ("-2**10", "-1024"),
        ("17 // 5 % 2", "1"),
        ("1.5*4", "6"),
    ],
)
def test_calculator(expression, result):
    assert Calculator()(expression) == result


@pytest.mark.parametrize(
    "expression, message",
    [
        ("__import__('os').system('true')", "unsupported"),
        ("(1).__class__", "unsupported"),
        ("abs(-3)", "unsupported"),
        ("9**9**9", "exponent"),
        ("1/0", "division by zero"),
        ("2*", "not an arithmetic expression"),
        ("10**60 * 10**60", "digits"),
    ],
)
def test_calculator_rejects_what_is_not_bounded_arithmetic(expression, message):
    with pytest.raises(ToolError, match=message):
        Calculator(max_digits=100)(expression)


def test_protocol_parses_calls_in_order():
    calls = ToolProtocol().calls(
        "I will compute <call>calc(1+2)</call> and <call> 3*4 </call> then <call>python(print(1)"
    )
    assert [(c.body, c.name, c.arguments, c.error is None) for c in calls] == [
        ("calc(1+2)", "calc", "1+2", True),
        ("3*4", None, "", True),
        ("python(print(1)", None, "", False),  # never closed: malformed
    ]
    assert ToolProtocol(max_result_chars=8).result("123456789") == "<result>12345...</result>"
    assert ToolProtocol().result("bad", error=True) == "<result>error: bad</result>"


def lookup(key: str = "", **kwargs) -> str:
    if key == "boom":
        raise KeyError("boom")
    if key == "slow":
        time.sleep(30)
    return {"pi": "3.14"}.get(key, f"unknown {key}") if not kwargs else f"{key}:{kwargs}"


def test_tool_environment_runs_calls_and_reports_errors():
    env = ToolEnvironment([Calculator(), FunctionTool(lookup, timeout_s=0.5)], error_reward=-0.1)
    state = env.reset({"prompt": "p"})
    assert env.step(state, _turn("the answer is 5")) == Step(done=True)
    step = env.step(state, _turn("<call>calc(6*7)</call><call>lookup(pi)</call>"))
    assert step == Step("<result>42</result><result>3.14</result>", None, False, 2, 0)
    step = env.step(state, _turn('<call>lookup({"key": "pi", "x": 1})</call>'))
    assert step.observation == "<result>pi:{'x': 1}</result>"
    step = env.step(state, _turn("<call>search(cats)</call><call>lookup(boom)</call><call>1+1</call><call>calc(1+"))
    assert step.observation == (
        "<result>error: unknown tool 'search'; the tools are ['calc', 'lookup']</result>"
        "<result>error: KeyError: 'boom'</result>"
        "<result>error: no tool named in '1+1'; write name(arguments) with a tool from ['calc', 'lookup']</result>"
        "<result>error: malformed call: the call was not closed with '</call>'</result>"
    )
    assert (step.tool_calls, step.tool_errors, step.done) == (4, 4, False)
    assert step.reward == pytest.approx(-0.4)
    start = time.monotonic()
    step = env.step(state, _turn("<call>lookup(slow)</call>"))
    assert time.monotonic() - start < 2.0
    assert step.observation == "<result>error: no answer within 0.5 s</result>" and step.tool_errors == 1


def test_a_result_that_is_not_valid_text_answers_an_error(tokenizer):
    from tests.fixtures.tools import unencodable

    env = ToolEnvironment([FunctionTool(unencodable), FunctionTool(boom_with_surrogate)])
    step = env.step(None, _turn("<call>unencodable()</call><call>boom_with_surrogate()</call>"))
    assert step.observation == (
        "<result>error: the tool's result is not valid text (surrogates not allowed at character 3)</result>"
        "<result>error: the tool's error is not valid text (surrogates not allowed at character 15)</result>"
    )
    assert (step.tool_calls, step.tool_errors) == (2, 2)
    assert len(tokenizer.encode(step.observation)) > 0  # the raw result would raise inside the tokenizer
    env.close()


def boom_with_surrogate(text: str) -> str:
    raise ValueError("caf\udcff")


def test_a_closed_environment_answers_at_once_until_the_next_episode():
    """close() (a run's teardown) stops the calls left in a turn under way; the next episode (reset) calls tools again."""
    env = ToolEnvironment([Calculator(), FunctionTool(lookup, timeout_s=5.0)])
    env.close()
    start = time.monotonic()
    step = env.step(None, _turn("<call>lookup(slow)</call><call>calc(1+1)</call>"))
    assert (
        step.observation == "<result>error: the environment was closed</result>" * 2 and time.monotonic() - start < 1.0
    )
    env.reset({})
    assert env.step(None, _turn("<call>calc(1+1)</call>")).observation == "<result>2</result>"


def test_default_tool_and_call_limit():
    env = ToolEnvironment([Calculator()], default_tool="calc", max_calls_per_turn=1)
    step = env.step(None, _turn("<call>123*45</call><call>1+1</call>"))
    assert step.observation == "<result>5535</result><result>error: at most 1 calls per turn</result>"
    with pytest.raises(ValueError, match="default_tool 'python' is not one of the tools"):
        ToolEnvironment([Calculator()], default_tool="python")
    with pytest.raises(ValueError, match="distinct names"):
        ToolEnvironment([Calculator(), Calculator()])


@pytest.mark.slow
def test_python_tool_limits():
    tool = PythonTool(timeout_s=1.0, memory_mb=200)
    assert tool("print(6*7)") == "42"
    with pytest.raises(ToolError, match="ZeroDivisionError"):
        tool("1/0")
    start = time.monotonic()
    with pytest.raises(ToolError, match="timed out after 1.0 s"):
        tool(
            "import time, subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\ntime.sleep(60)"
        )
    assert time.monotonic() - start < 3.0
    with pytest.raises(ToolError, match="MemoryError: more than 200 MiB"):
        tool("x = bytearray(400 << 20)")
    env = ToolEnvironment([PythonTool(timeout_s=1.0)])
    start = time.monotonic()
    step = env.step(None, _turn("<call>python(while True: pass)</call>"))
    assert time.monotonic() - start < 3.0
    assert step.observation == "<result>error: timed out after 1.0 s</result>"
    env = ToolEnvironment(
        [PythonTool(timeout_s=5.0, memory_mb=200)]
    )  # past its memory limit: an error result, within the timeout
    start = time.monotonic()
    step = env.step(None, _turn("<call>python(x = bytearray(400 << 20))</call>"))
    assert time.monotonic() - start < 5.0
    assert step.observation == "<result>error: MemoryError: more than 200 MiB</result>" and step.tool_errors == 1


def test_tools_are_configured_from_yaml_with_a_dotted_path():
    import yaml
    from jsonargparse import ArgumentParser

    from components.rollout import MultiTurnRollout

    parser = ArgumentParser()
    parser.add_argument("--agent", type=MultiTurnRollout)
    config = yaml.safe_load(
        """
        agent:
          class_path: components.rollout.MultiTurnRollout
          init_args:
            env:
              class_path: components.env.ToolEnvironment
              init_args:
                tools:
                  - class_path: components.env.Calculator
                  - class_path: components.env.FunctionTool
                    init_args: {fn: tests.components.test_env_tools.lookup, timeout_s: 2.0}
        """
    )
    agent = parser.instantiate_classes(parser.parse_object(config)).agent
    step = agent.env.step(None, _turn("<call>lookup(pi)</call><call>calc(2**5)</call>"))
    assert step.observation == "<result>3.14</result><result>32</result>"


@pytest.mark.slow
def test_python_tool_output_is_bounded_and_what_it_started_is_stopped(tmp_path):
    tool = PythonTool(timeout_s=5.0)
    start = time.monotonic()
    with pytest.raises(
        ToolError, match=r"standard output passed 1048576 bytes, the limit on each file it writes"
    ):  # a flood ends at once, never in the trainer's memory
        tool("while True: print('x' * 1000)")
    assert time.monotonic() - start < 5.0
    assert PythonTool(max_output_chars=10)("print('y' * 50)") == "y" * 10
    # a program that leaves a process running answers at once; the process is killed with it
    marker = tmp_path / "alive"
    later = f"import time; time.sleep(1.5); open({str(marker)!r}, 'w')"
    code = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {later!r}])\nprint(1)"
    start = time.monotonic()
    assert tool(code) == "1" and time.monotonic() - start < 1.5
    time.sleep(2.0)
    assert not marker.exists()
