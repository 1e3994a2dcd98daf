"""Tool calls as the model sees them, and the sandbox and FunctionTool scenarios that both their own tests
(tests/components/test_sandbox.py, test_function_tool.py) and the fault matrix (tests/test_fault_matrix.py) run."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from components.env import FunctionTool, PythonTool, ToolError
from tests.fixtures.tools import flood


def attempt(tool, code: str) -> str:
    """What the model reads back: the tool's answer (a program's output), or its error."""
    try:
        return tool(code)
    except ToolError as err:
        return f"error: {err}"


def on_a_thread(call, join_s: float = 15.0) -> list:
    """``call()`` on a background thread, as the rollout-ahead thread of asynchronous training calls tools."""
    answers = []
    caller = threading.Thread(target=lambda: answers.append(call()), daemon=True)
    caller.start()
    caller.join(join_s)
    assert not caller.is_alive(), "the call still runs"
    return answers


def check_no_file_outside_the_scratch_folder_is_read_or_written(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_rsa"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY----- trainer-key")
    monkeypatch.setenv("HOME", str(home))
    run_folder = tmp_path / "run"
    (run_folder / "checkpoints").mkdir(parents=True)
    checkpoint = run_folder / "checkpoints" / "last.ckpt"
    checkpoint.write_bytes(b"weights")
    monkeypatch.chdir(run_folder)
    tool = PythonTool(timeout_s=5.0)
    for path in (str(key), "~/.ssh/id_rsa"):
        assert "trainer-key" not in attempt(tool, f"import os; print(open(os.path.expanduser({path!r})).read())")
    for path in (str(checkpoint), "checkpoints/last.ckpt"):
        attempt(tool, f"import os; os.remove({path!r})")
        attempt(tool, f"open({path!r}, 'wb').write(b'overwritten')")
    for path in (str(run_folder / "planted"), "planted", str(tmp_path / "planted")):
        attempt(tool, f"open({path!r}, 'w').write('x')")
    assert checkpoint.read_bytes() == b"weights"
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(
        ["home", ".ssh", "id_rsa", "run", "checkpoints", "last.ckpt"]
    )
    # the scratch folder is writable while the program runs and empty at the next call
    assert attempt(tool, "open('notes', 'w').write('kept?'); print(open('notes').read())") == "kept?"
    # (it holds nothing else but the folders leading to an interpreter that lives under /tmp, read-only)
    from components.env.sandbox import mounts

    under_tmp = sorted({path.split("/")[2] for _, path in mounts(False) if path.startswith("/tmp/")})
    assert attempt(tool, "import os; print(os.listdir('.'))") == str(under_tmp)


def check_process_count_is_bounded():
    tool = PythonTool(timeout_s=10.0)
    bomb = (
        "import os, time\nn = 0\ntry:\n    while n < 200:\n        if os.fork() == 0:\n            time.sleep(30); os._exit(0)\n        n += 1\n"
        "except OSError as err:\n    print('refused after', n, err.strerror)\nelse:\n    print('forked', n)"
    )
    answer = attempt(tool, bomb)
    assert answer.startswith("refused after") and int(answer.split()[2]) <= 32, answer


def check_without_namespaces_the_tool_refuses_unless_opted_out():
    """A trainer in a user namespace that may create none (user.max_user_namespaces = 0, as a locked-down container)."""
    script = (
        "import time, warnings\nfrom components.env import PythonTool\nstart = time.monotonic()\n"
        "try: PythonTool()\nexcept RuntimeError as err: print(err)\nprint(time.monotonic() - start)\n"
        "with warnings.catch_warnings(record=True) as caught:\n    warnings.simplefilter('always')\n    tool = PythonTool(isolation='none')\n"
        "print(caught[0].message)\nprint(tool('print(6 * 7)'))"
    )
    run = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "sh",
            "-c",
            'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"',
            "sh",
            sys.executable,
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
    )
    refusal, refused_after_s, warning, answer = run.stdout.strip().splitlines()
    # the probe runs an empty program with timeout_s=30: a failed unshare is known at once, not at that timeout
    assert float(refused_after_s) < 30.0, f"the refusal waited for the probe's timeout ({refused_after_s} s)"
    assert refusal.startswith(
        "PythonTool cannot isolate the model's code on this machine: error: [Errno 28] unshare(CLONE_NEWUSER)"
    )
    assert "isolation: none" in refusal and "SandboxFusionTool" in refusal
    assert warning.startswith(
        "PythonTool(isolation: none): the program runs with the trainer's user and rights: it can read the trainer's files and secrets"
    )
    assert answer == "42"


def check_what_a_tool_prints_never_reaches_the_trainers_log(capfd):
    tool = FunctionTool(flood, timeout_s=60.0)
    try:
        assert tool("") == "printed 100 MB"
    finally:
        tool.close()
    out, err = capfd.readouterr()
    assert len(out) + len(err) < 1000
