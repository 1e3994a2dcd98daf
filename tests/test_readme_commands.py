"""The README's commands, run as printed on CPU in a scratch folder that holds the repository's configs: `lightning-rl`
through the function its console script calls, `python cli.py` (the same CLI) as a subprocess. A fit gets flags
appended that shorten it (later flags win); nothing else is changed."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import pythonpath

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SHORT = ["--data.batch_size=4", "--data.val_size=4"]  # and max_steps: 2, or 3 for a resumed run


def bash_block(heading: str, index: int = 0) -> list[str]:
    """The commands of the ``index``-th ```bash block after ``heading`` (comments and continuations joined)."""
    section = README[README.index(heading) :]
    block = re.findall(r"```bash\n(.*?)```", section, flags=re.S)[index]
    text = block.replace("\\\n", " ")
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def _argv(command: str, via_shim: bool = False) -> list[str]:
    words = shlex.split(command)
    if words[0] == "lightning-rl":
        words = ["python", "cli.py", *words[1:]] if via_shim else ["python", "-m", "lightning_rl.cli", *words[1:]]
    assert words[:2] in (["python", "cli.py"], ["python", "-m"]), command
    if "fit" in words and not {"--print_config", "--dry_run"} & set(words):
        words += [*SHORT, "--trainer.max_steps=3" if "--ckpt_path" in words else "--trainer.max_steps=2"]
    return [sys.executable, *words[1:]]


@pytest.fixture
def run(monkeypatch, capsys):
    """Run a README command in the current folder; returns what it printed. `lightning-rl` runs in this process (the
    function its console script calls, without paying an interpreter start per command) unless it starts a strategy
    (a process group outlives the command); `python ...` runs as a subprocess."""

    def run_(command: str, via_shim: bool = False) -> str:
        argv = _argv(command, via_shim)
        if argv[1:3] == ["-m", "lightning_rl.cli"] and "configs/strategy/" not in command:
            from lightning_rl.cli import entry

            monkeypatch.setattr("sys.argv", ["lightning-rl", *argv[3:]])
            monkeypatch.setattr("sys.path", list(sys.path))  # entry() moves the working folder to its end
            try:
                entry()
            except SystemExit as done:  # --print_config exits 0
                assert done.code in (0, None), command
            return capsys.readouterr().out
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": pythonpath()}
        )
        assert done.returncode == 0, f"{command}\n{(done.stdout + done.stderr)[-3000:]}"
        return done.stdout + done.stderr

    return run_


@pytest.fixture
def scratch(tmp_path, monkeypatch) -> Path:
    """The working folder, like a clone's root, where runs/ is written: the configs, the shim, the loopback server."""
    for name in ("configs", "cli.py", "tests", "lightning_rl"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.slow
def test_running_scaling_out_and_export_commands_as_printed(scratch, run):
    running = bash_block("## Running")
    assert any(c.startswith("python cli.py") for c in running) and any("--dry_run" in c for c in running)
    out = {command: run(command) for command in running}
    assert (
        "model.sampling" not in out["lightning-rl fit --config configs/ppo_rlhf.yaml --dry_run"]
    )  # ppo_rlhf has no dynamic sampling
    assert "model.critic      ValueCritic" in out["lightning-rl fit --config configs/ppo_rlhf.yaml --dry_run"]
    grpo = scratch / "runs" / "grpo"
    # the run of `--model.optimizer.lr 3e-4` is validated, then continued in its own folder, its config untouched
    (trained,) = [p.parent for p in grpo.glob("version_*/config.yaml") if "lr: 0.0003" in p.read_text()]
    assert torch.load(trained / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 3
    assert {"resume_config.yaml", "validate_config.yaml"} <= {p.name for p in trained.iterdir()}
    # `python cli.py fit --config configs/grpo.yaml` after it is a new run, and the newest
    assert torch.load(grpo / "latest" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2
    assert (grpo / "latest" / "checkpoints").resolve().parent.name == f"version_{len(list(grpo.glob('version_*'))) - 1}"

    (export,) = [c for c in bash_block("**Export**") if c.startswith("lightning-rl export")]
    run(export)
    assert (scratch / "runs" / "grpo" / "hf" / "policy" / "config.json").exists()
    # `python cli.py` above trained through the shim; its other subcommands are tested in lightning_rl/cli/test_cli.py
    assert "components.advantage.GroupNormalized" in run("lightning-rl components", via_shim=True)


def _wait_listening(port: int, process: subprocess.Popen, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read()[-3000:]
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on port {port} after {timeout_s} s")


@pytest.mark.slow
def test_the_asynchronous_cpu_route_as_printed(scratch, run):
    server_command, fit = bash_block("## Asynchronous training", index=1)
    with socket.socket() as s:  # the printed port may be taken on a shared machine: the same command on a free one
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server_argv = shlex.split(server_command.rstrip("&").replace("--port 30000", f"--port {port}"))
    assert server_argv[:3] == ["python", "-m", "tests.fixtures.sglang_server"]
    server = subprocess.Popen(
        [sys.executable, *server_argv[1:]],
        cwd=scratch,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": pythonpath()},
    )
    try:
        _wait_listening(port, server)
        printed = run(f"{fit} --model.rollout.init_args.base_url=http://127.0.0.1:{port}")
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert "samples at iteration 1" in printed
    (run,) = (scratch / "runs" / "grpo").glob("version_*")
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2


def python_block(heading: str) -> str:
    """The first ```python block after ``heading``."""
    section = README[README.index(heading) :]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]


PYTHON_NOISE = (
    "Tip:",
    "dataloader_iter",
    "eval mode",
    "FLOPs",
    "Name ",
    "Epoch 0/",
    "v_num",
    "GPU available",
    "Loading weights",
    "Seed set to",
    "`Trainer.fit` stopped",
    "Traceback",
)


@pytest.mark.slow
def test_the_python_snippet_prints_and_writes_what_the_cli_does(scratch):
    """The README's "In Python" snippet, run as printed (fewer iterations): the console of `lightning-rl fit` (the bar
    in RL iterations, the samples table, no tips, warnings or model summary) and its run folder, not lightning_logs/."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    code = python_block("### In Python")
    assert "max_steps=100" in code
    (scratch / "snippet.py").write_text(code.replace("max_steps=100", "max_steps=2"))
    done = subprocess.run(
        [sys.executable, "snippet.py"],
        cwd=scratch,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-3000:]
    assert not [noise for noise in PYTHON_NOISE if noise in printed], printed
    assert "RL iterations" in printed and "2/2" in printed and "samples at iteration 1" in printed
    assert not (scratch / "lightning_logs").exists()
    (run,) = (scratch / "runs").glob("*/version_0")
    events = EventAccumulator(str(run))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert "hp_metric" not in tags and {"reward/mean", "val/reward", "total/samples"} <= set(tags)
    assert torch.load(run.parent / "latest" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2
    assert not (
        run.parent / "latest" / "config.yaml"
    ).is_symlink()  # no config.yaml to link to: the script is the record


@pytest.mark.slow
def test_the_sft_warm_start_commands_as_printed(scratch, run):
    """Supervised fine-tuning, its export, and an RL run from the export: each README command as printed (shortened)."""
    sft, export, rl = bash_block("### Supervised fine-tuning")
    assert sft.startswith("python -m lightning_rl.recipes.sft fit --config configs/sft.yaml")
    run(sft)
    assert (
        torch.load(scratch / "runs" / "sft" / "latest" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
        == 2
    )
    run(export)
    assert (scratch / "runs" / "sft" / "hf" / "policy" / "model.safetensors").exists()
    run(rl)
    (trained,) = (scratch / "runs" / "grpo").glob("version_*")
    assert "path: runs/sft/hf/policy" in (trained / "config.yaml").read_text()
    assert torch.load(trained / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2


def test_the_own_data_example_names_the_shipped_model_and_how_to_name_a_hub_model():
    import yaml

    section = README[README.index("### Your own data and reward") :]
    config = yaml.safe_load(re.findall(r"```yaml\n(.*?)```", section, flags=re.S)[0])
    path = config["model"]["policy"]["path"]
    assert (ROOT / path / "config.json").exists() and (
        ROOT / path / "tokenizer.json"
    ).exists()  # runs on a CPU newcomer's clone
    assert config["data"]["chat_template"] is False  # the shipped tokenizer has no chat template
    assert "--model.policy.path Qwen/" in section[: section.index("\n## ")]


@pytest.mark.slow
def test_the_distillation_recipe_commands_as_printed(scratch, run):
    """SFT, then distillation from the shipped teacher, then GRPO, each from the previous export (shortened)."""
    sft, export_sft, distill, export_distill, rl = bash_block("### On-policy distillation", index=1)
    for command in (sft, export_sft, distill, export_distill, rl):
        run(command)
    (distilled,) = (scratch / "runs" / "distill").glob("version_*")
    assert "path: runs/sft/hf/policy" in (distilled / "config.yaml").read_text()
    assert "class_path: components.teacher.HFTeacher" in (distilled / "config.yaml").read_text()
    (trained,) = (scratch / "runs" / "grpo").glob("version_*")
    assert "path: runs/distill/hf/policy" in (trained / "config.yaml").read_text()
    assert torch.load(trained / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(command: str, printed_port: str, port: int, cwd: Path, python: str = sys.executable) -> subprocess.Popen:
    """A README server command on a free port (the printed one may be taken on a shared machine), its interpreter
    ``python``."""
    argv = shlex.split(command.rstrip("&").replace(f"--port {printed_port}", f"--port {port}"))
    assert argv[0] in ("python", ".venv-vllm/bin/python") and argv[1] == "-m", command
    env = {**os.environ, "PYTHONPATH": pythonpath()}
    return subprocess.Popen([python, *argv[1:]], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)  # fmt: skip


def _stop(server: subprocess.Popen) -> None:
    import signal

    os.killpg(server.pid, signal.SIGTERM)  # the server and what it started (vLLM's engine core)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


@pytest.mark.slow
def test_the_sglang_teacher_commands_as_printed(scratch, run):
    """The loopback server in SGLang's place, serving the shipped teacher, and a distillation fit scored by it."""
    server_command, fit = bash_block("#### A teacher on a server", index=1)[:2]
    port = _free_port()
    server = _start(server_command, "30001", port, scratch)
    try:
        _wait_listening(port, server)
        run(f"{fit} --model.teacher.init_args.base_url=http://127.0.0.1:{port}")
    finally:
        _stop(server)
    (distilled,) = (scratch / "runs" / "distill").glob("version_*")
    assert "class_path: components.teacher.SGLangTeacher" in (distilled / "config.yaml").read_text()
    assert torch.load(distilled / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2


@pytest.mark.slow
@pytest.mark.xdist_group("vllm")
def test_the_vllm_teacher_commands_as_printed(scratch, run):
    """A fit that launches vLLM on the shipped teacher, then a plain vLLM server and a fit scored by its
    /v1/completions."""
    from components.rollout.vllm.environment import vllm_python
    from tests.fixtures.vllm_server import healthy, unavailable

    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no real vLLM server: {reason}")
    (launched,) = bash_block("#### A teacher on a server")
    run(launched)
    server_command, fit = bash_block("#### A teacher on a server", index=1)[2:]
    port = _free_port()
    server = _start(server_command, "8001", port, scratch, python=vllm_python())
    try:
        deadline = time.monotonic() + 600
        while not healthy(f"http://127.0.0.1:{port}"):
            assert server.poll() is None and time.monotonic() < deadline, server.stdout.read()[-3000:]
            time.sleep(1.0)
        run(f"{fit} --model.teacher.init_args.base_url=http://127.0.0.1:{port}")
    finally:
        _stop(server)
    runs = sorted((scratch / "runs" / "distill").glob("version_*"))
    assert [
        ("VLLMTeacher" in c, "CompletionsTeacher" in c) for c in (r.joinpath("config.yaml").read_text() for r in runs)
    ] == [(True, False), (False, True)]
    assert all(torch.load(r / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2 for r in runs)
