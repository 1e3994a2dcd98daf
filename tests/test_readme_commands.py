"""The commands of the README and of every page in docs/, run as printed on CPU in a scratch folder that holds the
repository's configs: `lightning-rl` through the function its console script calls, `python ...` as a subprocess. A
`fit` (and `sft`, `distill`, `reward-model`) gets flags appended that shorten it (later flags win), a `validate` a
smaller held-out set; nothing else is changed.

`RUN` names the test that runs each ```bash block; a block no test can run here (a GPU, a cluster, a server this
machine does not have, the suite itself) says why in a ``<!-- not run by the tests: ... -->`` line just above it.
`test_every_command_in_the_docs_is_run_or_says_why_not` holds every page to that."""

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
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
SHORT = ["--data.batch_size=4", "--data.val_size=4"]  # and max_steps: 2, or 3 for a resumed run
TRAINING = {"fit", "sft", "distill", "reward-model"}  # the subcommands that train
NOT_RUN = "<!-- not run by the tests: "
BLOCK = re.compile(r"```bash\n(.*?)```", flags=re.S)

RUN = {
    ("README.md", "## Set-up", 1): "test_activating_the_environment_puts_lightning_rl_on_the_path",
    ("README.md", "## An example", 0): "test_the_readmes_example_as_printed",
    ("docs/getting-started.md", "## Set-up", 1): "test_activating_the_environment_puts_lightning_rl_on_the_path",
    ("docs/getting-started.md", "## One command", 0): "test_help_lists_every_subcommand_in_one_line_each",
    ("docs/getting-started.md", "## Running", 0): "test_running_and_export_commands_as_printed",
    ("docs/getting-started.md", "## Export", 0): "test_running_and_export_commands_as_printed",
    ("docs/train-with-rl.md", "**Weights & Biases", 0): "test_the_logger_fragments_as_printed",
    ("docs/train-with-rl.md", "## Supervised fine-tuning", 0): "test_the_sft_warm_start_commands_as_printed",
    ("docs/train-with-rl.md", "## PPO-RLHF", 0): "test_the_reward_model_commands_as_printed",
    ("docs/distillation.md", "# On-policy distillation", 0): "test_the_readmes_example_as_printed",
    ("docs/distillation.md", "SFT, then distillation, then RL", 0): "test_the_distillation_recipe_commands_as_printed",
    ("docs/distillation.md", "## A teacher on a server", 0): "test_the_vllm_teacher_commands_as_printed",
    ("docs/distillation.md", "## A teacher on a server", 1): "test_the_sglang_teacher_commands_as_printed",
    ("docs/agents.md", "## Multi-turn episodes", 0): "test_the_agent_commands_as_printed",
    ("docs/agents.md", "## Bring your own agent", 0): "test_the_openai_and_verifiers_agents_as_printed",
    ("docs/agents.md", "# verifiers_calc.yaml", 0): "test_the_openai_and_verifiers_agents_as_printed",
    ("docs/agents.md", "[reasoning-gym]", 0): "test_the_reasoning_gym_preset_as_printed",
    ("docs/vision-language.md", "# Vision-language", 0): "test_the_vision_language_preset_as_printed",
    ("docs/lora.md", "# LoRA", 0): "test_the_lora_commands_as_printed",
    ("docs/rollouts.md", "# Record and replay rollouts", 0): "test_the_rollout_record_commands_as_printed",
    ("docs/servers.md", "## vLLM rollout", 0): "test_the_vllm_rollout_as_printed",
    ("docs/servers.md", "On a CPU, without SGLang", 0): "test_the_asynchronous_cpu_route_as_printed",
    ("docs/development.md", "Some tests, in one process", 0): "test_some_tests_in_one_process_as_printed",
    ("docs/development.md", "The documentation is these pages", 0): "test_the_docs_build_strict",
    ("docs/reference.md", "## Components", 0): "test_the_reference_lists_the_components_lightning_rl_components_prints",
    ("docs/writing-a-component.md", "All three in one run", 0): (
        "tests/docs/test_writing_a_component.py::test_the_three_train_together"
    ),
}
"""(page, text before the block, which ```bash block after that text) -> the test that runs it."""


def _text(page: str) -> str:
    return (ROOT / page).read_text()


def _block_start(page: str, after: str, index: int = 0) -> int:
    text = _text(page)
    start = text.index(after)
    return [m.start() for m in BLOCK.finditer(text) if m.start() > start][index]


def _commands(block: str) -> list[str]:
    """A block's commands: continuations joined, comments dropped."""
    text = block.replace("\\\n", " ")
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def bash_block(page: str, after: str, index: int = 0) -> list[str]:
    """The commands of the ``index``-th ```bash block after the text ``after`` in ``page``; the block must be in `RUN`."""
    assert (page, after, index) in RUN, f"add ({page!r}, {after!r}, {index}) to RUN"
    return _commands(BLOCK.match(_text(page), _block_start(page, after, index)).group(1))


def test_every_command_in_the_docs_is_run_or_says_why_not():
    run = {(page, _block_start(page, after, index)) for page, after, index in RUN}
    for test in set(RUN.values()):  # a test here, or FILE::NAME in another file
        file, _, name = test.rpartition("::")
        defined = _text(file) if file else "".join(f"def {n}(" for n in globals() if n.startswith("test_"))
        assert f"def {name}(" in defined, test
    assert "README.md" in PAGES and len(PAGES) >= 12
    unaccounted = []
    for page in PAGES:
        text = _text(page)
        for block in BLOCK.finditer(text):
            said = text[: block.start()].rstrip("\n").rsplit("\n", 1)[-1]
            if (page, block.start()) not in run and not (said.startswith(NOT_RUN) and said.endswith(" -->")):
                unaccounted.append(f"{page}: {_commands(block.group(1))}")
    assert not unaccounted, "a ```bash block that no test runs and that does not say why:\n" + "\n".join(unaccounted)


def test_the_readme_links_to_pages_that_exist():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", _text("README.md"))
    assert len(links) >= 12 and [link for link in links if not (ROOT / link).exists()] == []


def _argv(command: str, via_shim: bool = False) -> tuple[list[str], dict[str, str]]:
    """The command as an argv for this interpreter, the shortening flags appended, and the environment it sets."""
    words = shlex.split(command)
    env = {}
    while re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):  # OMP_NUM_THREADS=1 lightning-rl ...
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if words[0] == "lightning-rl":
        words = ["python", "cli.py", *words[1:]] if via_shim else ["python", "-m", "lightning_rl.cli", *words[1:]]
    assert words[:2] in (["python", "cli.py"], ["python", "-m"]), command
    subcommand = words[3] if words[1] == "-m" else words[2]
    if subcommand in TRAINING and not {"--print_config", "--dry_run", "validate"} & set(words):
        words += [*SHORT, "--trainer.max_steps=3" if "--ckpt_path" in words else "--trainer.max_steps=2"]
    elif subcommand == "validate":
        words += ["--data.val_size=4"]
    return [sys.executable, *words[1:]], env


@pytest.fixture
def run(monkeypatch, capsys):
    """Run a documented command in the current folder; returns what it printed. `lightning-rl` runs in this process
    (the function its console script calls, without paying an interpreter start per command) unless it starts a
    strategy (a process group outlives the command); `python ...` runs as a subprocess."""

    def run_(command: str, via_shim: bool = False) -> str:
        argv, env = _argv(command, via_shim)
        if argv[1:3] == ["-m", "lightning_rl.cli"] and "configs/strategy/" not in command:
            from lightning_rl.command import entry

            for name, value in env.items():
                monkeypatch.setenv(name, value)
            monkeypatch.setattr("sys.argv", ["lightning-rl", *argv[3:]])
            monkeypatch.setattr("sys.path", list(sys.path))  # entry() moves the working folder to its end
            try:
                entry()
            except SystemExit as done:  # --print_config and --help exit 0
                assert done.code in (0, None), command
            return capsys.readouterr().out
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=600, env={**os.environ, **env, "PYTHONPATH": pythonpath()}
        )
        assert done.returncode == 0, f"{command}\n{(done.stdout + done.stderr)[-3000:]}"
        return done.stdout + done.stderr

    return run_


@pytest.fixture
def scratch(tmp_path, monkeypatch) -> Path:
    """The working folder, like a clone's root, where runs/ is written: the configs, the shim, the loopback server,
    the examples."""
    for name in ("configs", "cli.py", "tests", "lightning_rl", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _last_step(run_folder: Path) -> int:
    return torch.load(run_folder / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]


def test_activating_the_environment_puts_lightning_rl_on_the_path():
    """`source .venv/bin/activate`, after `make run`, from the clone's root: `lightning-rl` is the environment's."""
    (activate,) = bash_block("README.md", "## Set-up", 1)
    assert activate == "source .venv/bin/activate"
    assert bash_block("docs/getting-started.md", "## Set-up", 1) == [activate]
    venv = ROOT / ".venv"
    if not (venv / "bin" / "activate").exists():
        pytest.skip("no .venv in this clone (make run creates it)")
    found = subprocess.run(
        ["bash", "-c", f"{activate} && command -v lightning-rl"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert found == str(venv / "bin" / "lightning-rl")


def test_help_lists_every_subcommand_in_one_line_each(run, monkeypatch):
    from lightning_rl.cli.commands import SUBCOMMANDS

    (command,) = bash_block("docs/getting-started.md", "## One command", 0)
    assert command == "lightning-rl --help"
    monkeypatch.setenv("COLUMNS", "80")  # a terminal's width
    printed = run(command)
    listed = dict(re.findall(r"^    ([\w-]+) +(\S.*)$", printed, flags=re.M))
    assert list(listed) == [
        "fit",
        "validate",
        "distill",
        "sft",
        "reward-model",
        "export",
        "components",
        "replay",
        "rollouts",
        "serve",
    ], printed
    assert listed == SUBCOMMANDS, printed  # each whole on its line


@pytest.mark.slow
@pytest.mark.soak  # make test keeps the README's other commands
def test_running_and_export_commands_as_printed(scratch, run):
    running = bash_block("docs/getting-started.md", "## Running", 0)
    assert any(c.startswith("python cli.py") for c in running) and any("--dry_run" in c for c in running)
    out = {command: run(command) for command in running}
    assert (
        "model.sampling" not in out["lightning-rl fit --config configs/ppo_rlhf.yaml --dry_run"]
    )  # ppo_rlhf has no dynamic sampling
    assert "model.critic      ValueCritic" in out["lightning-rl fit --config configs/ppo_rlhf.yaml --dry_run"]
    grpo = scratch / "runs" / "grpo"
    # the run of `--model.optimizer.lr 3e-4` is validated, then continued in its own folder, its config untouched
    (trained,) = [p.parent for p in grpo.glob("version_*/config.yaml") if "lr: 0.0003" in p.read_text()]
    assert _last_step(trained) == 3
    assert {"resume_config.yaml", "validate_config.yaml"} <= {p.name for p in trained.iterdir()}
    # `python cli.py fit --config configs/grpo.yaml` after it is a new run, and the newest
    assert _last_step(grpo / "latest") == 2
    assert (grpo / "latest" / "checkpoints").resolve().parent.name == f"version_{len(list(grpo.glob('version_*'))) - 1}"

    (export,) = bash_block("docs/getting-started.md", "## Export", 0)
    run(export)
    assert (scratch / "runs" / "grpo" / "hf" / "policy" / "config.json").exists()
    # `python cli.py` above trained through the shim; its other subcommands are tested in lightning_rl/cli/test_cli.py
    assert "components.advantage.GroupNormalized" in run("lightning-rl components", via_shim=True)


@pytest.mark.slow
def test_the_readmes_example_as_printed(scratch, run):
    """The front page's example: a preset, its validation, SFT, distillation, an export and the component list; the
    distillation page's first command (`lightning-rl distill`) is one of them."""
    example = bash_block("README.md", "## An example", 0)
    assert set(bash_block("docs/distillation.md", "# On-policy distillation", 0)) <= set(example)
    printed = {command: run(command) for command in example}
    (dapo,) = (scratch / "runs" / "dapo").glob("version_*")
    assert _last_step(dapo) == 2 and {"config.yaml", "validate_config.yaml"} <= {p.name for p in dapo.iterdir()}
    assert _last_step(scratch / "runs" / "sft" / "latest") == 2
    distilled = scratch / "runs" / "distill" / "latest"
    assert _last_step(distilled) == 2 and "components.teacher.HFTeacher" in (distilled / "config.yaml").read_text()
    assert (scratch / "runs" / "dapo" / "hf" / "policy" / "model.safetensors").exists()
    assert "components.teacher.HFTeacher" in printed["lightning-rl components"]


@pytest.mark.slow
def test_the_logger_fragments_as_printed(scratch, run):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    for command in bash_block("docs/train-with-rl.md", "**Weights & Biases", 0):
        run(command)
    assert len({p.resolve() for p in (scratch / "runs").glob("**/checkpoints/last.ckpt")}) == 2  # latest/ links one
    assert (scratch / "runs" / "mlflow.db").exists()


def python_block(page: str, heading: str) -> str:
    """The first ```python block after ``heading``."""
    text = _text(page)
    return re.findall(r"```python\n(.*?)```", text[text.index(heading) :], flags=re.S)[0]


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
    """The "In Python" snippet, run as printed (fewer iterations): the console of `lightning-rl fit` (the bar in RL
    iterations, the samples table, no tips, warnings or model summary) and its run folder, not lightning_logs/."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    code = python_block("docs/train-with-rl.md", "## In Python")
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
    assert _last_step(run.parent / "latest") == 2
    assert not (
        run.parent / "latest" / "config.yaml"
    ).is_symlink()  # no config.yaml to link to: the script is the record


@pytest.mark.slow
def test_the_sft_warm_start_commands_as_printed(scratch, run):
    """Supervised fine-tuning, its export, and an RL run from the export: each command as printed (shortened)."""
    sft, export, rl = bash_block("docs/train-with-rl.md", "## Supervised fine-tuning", 0)
    assert sft.startswith("lightning-rl sft --config configs/sft.yaml")
    run(sft)
    assert _last_step(scratch / "runs" / "sft" / "latest") == 2
    run(export)
    assert (scratch / "runs" / "sft" / "hf" / "policy" / "model.safetensors").exists()
    run(rl)
    (trained,) = (scratch / "runs" / "grpo").glob("version_*")
    assert "path: runs/sft/hf/policy" in (trained / "config.yaml").read_text()
    assert _last_step(trained) == 2


@pytest.mark.slow
def test_the_reward_model_commands_as_printed(scratch, run):
    """A reward model on the built-in pairs, then PPO-RLHF scored by it."""
    reward_model, ppo = bash_block("docs/train-with-rl.md", "## PPO-RLHF", 0)
    run(reward_model)
    assert (scratch / "runs" / "reward_model" / "final" / "model.safetensors").exists()
    run(ppo)
    (trained,) = (scratch / "runs" / "ppo_rlhf").glob("version_*")
    assert "path: runs/reward_model/final" in (trained / "config.yaml").read_text()
    assert _last_step(trained) == 2


def test_the_own_data_example_names_the_shipped_model_and_how_to_name_a_hub_model():
    import yaml

    text = _text("docs/train-with-rl.md")
    section = text[text.index("## Your own data and reward") :]
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
    sft, export_sft, distill, export_distill, rl = bash_block("docs/distillation.md", "SFT, then distillation, then RL")
    for command in (sft, export_sft, distill, export_distill, rl):
        run(command)
    (distilled,) = (scratch / "runs" / "distill").glob("version_*")
    assert "path: runs/sft/hf/policy" in (distilled / "config.yaml").read_text()
    assert "class_path: components.teacher.HFTeacher" in (distilled / "config.yaml").read_text()
    (trained,) = (scratch / "runs" / "grpo").glob("version_*")
    assert "path: runs/distill/hf/policy" in (trained / "config.yaml").read_text()
    assert _last_step(trained) == 2


@pytest.mark.slow
def test_the_agent_commands_as_printed(scratch, run):
    """The calculator agent with GRPO, then with PPO and a critic (shortened)."""
    for command in bash_block("docs/agents.md", "## Multi-turn episodes", 0):
        run(command)
    runs = sorted((scratch / "runs").glob("*/version_*/config.yaml"))
    assert len(runs) == 2 and sum("components.critic.ValueCritic" in c.read_text() for c in runs) == 1
    assert all(_last_step(c.parent) == 2 for c in runs)


@pytest.mark.slow
@pytest.mark.server
def test_the_openai_and_verifiers_agents_as_printed(scratch, run):
    """The OpenAI-client agent, then the verifiers environment with the page's config saved as verifiers_calc.yaml."""
    pytest.importorskip("verifiers")
    (openai_agent,) = bash_block("docs/agents.md", "## Bring your own agent", 0)
    run(openai_agent)
    config = re.findall(r"```yaml\n(# verifiers_calc.yaml\n.*?)```", _text("docs/agents.md"), flags=re.S)[0]
    (scratch / "verifiers_calc.yaml").write_text(config)
    (verifiers,) = bash_block("docs/agents.md", "# verifiers_calc.yaml", 0)
    run(verifiers)
    runs = sorted((scratch / "runs").glob("*/version_*/config.yaml"))
    assert len(runs) == 2 and sum("components.rollout.VerifiersAgent" in c.read_text() for c in runs) == 1
    assert all(_last_step(c.parent) == 2 for c in runs)


@pytest.mark.slow
def test_the_reasoning_gym_preset_as_printed(scratch, run):
    pytest.importorskip("reasoning_gym")
    (command,) = bash_block("docs/agents.md", "[reasoning-gym]", 0)
    assert command.startswith("OMP_NUM_THREADS=1 lightning-rl fit")
    run(command)
    (trained,) = (scratch / "runs").glob("*/version_*")
    assert "reasoning_gym:basic_arithmetic" in (trained / "config.yaml").read_text() and _last_step(trained) == 2


@pytest.mark.slow
def test_the_vision_language_preset_as_printed(scratch, run):
    (command,) = bash_block("docs/vision-language.md", "# Vision-language", 0)
    run(command)
    (trained,) = (scratch / "runs").glob("*/version_*")
    assert "builtin:count_shapes" in (trained / "config.yaml").read_text() and _last_step(trained) == 2


@pytest.mark.slow
def test_the_lora_commands_as_printed(scratch, run):
    for command in bash_block("docs/lora.md", "# LoRA", 0):
        run(command)
    runs = sorted((scratch / "runs").glob("*/version_*/config.yaml"))
    assert len(runs) == 2 and all("rank:" in c.read_text() for c in runs)
    assert all(_last_step(c.parent) == 2 for c in runs)


@pytest.mark.slow
def test_the_rollout_record_commands_as_printed(scratch, run, monkeypatch):
    """Record 2 iterations, show them, replay them (the run's parameters bit for bit) and replay them with another
    estimator (other parameters); then the page's Python snippet reads the record."""
    monkeypatch.setenv("COLUMNS", "200")
    fit, summary, samples, replay, other = bash_block("docs/rollouts.md", "# Record and replay rollouts", 0)
    run(fit)
    assert "2 iterations, 1 rank(s)" in run(summary)
    assert "iteration 2 (rank 0): 32 samples trained by policy version 1, staleness 0..0" in run(samples)
    run(replay)
    run(other)
    recorded, replayed, estimated = (
        torch.load(scratch / f"runs/grpo/version_{n}/checkpoints/last.ckpt", weights_only=False)["state_dict"]
        for n in range(3)
    )
    assert all(torch.equal(recorded[k], replayed[k]) for k in recorded) and set(recorded) == set(replayed)
    weight = "policy.model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(recorded[weight], estimated[weight])
    assert "LeaveOneOut" in (scratch / "runs/grpo/version_2/config.yaml").read_text()
    code = python_block("docs/rollouts.md", "## Reading")
    (scratch / "snippet.py").write_text(code + "\nprint(table.num_rows, table.column_names)\n")
    done = subprocess.run(
        [sys.executable, "snippet.py"], cwd=scratch, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # iteration, version, mean reward, largest staleness per iteration; then the table's rows and columns
    lines = done.stdout.splitlines()
    assert [line.split()[:2] + [line.split()[3]] for line in lines[:2]] == [["1", "0", "0"], ["2", "1", "0"]]
    assert lines[2] == "32 ['columns.prompts', 'columns.completions', 'scores', 'staleness']"


@pytest.mark.slow
def test_some_tests_in_one_process_as_printed():
    (command,) = bash_block("docs/development.md", "Some tests, in one process", 0)
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "pytest"]
    done = subprocess.run(
        [sys.executable, *words[1:], "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and re.search(r"\b[1-9]\d* passed", done.stdout), done.stdout[-3000:]


def test_the_docs_build_strict(tmp_path):
    """`make docs`: MkDocs on mkdocs.yml, strict (a broken link or anchor, or a page left out of the navigation,
    fails it)."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    assert bash_block("docs/development.md", "The documentation is these pages", 0) == ["make docs"]
    assert "mkdocs build --strict" in (ROOT / "Makefile").read_text()
    config = load_config(str(ROOT / "mkdocs.yml"), site_dir=str(tmp_path / "site"))
    assert config["strict"]
    build(config)
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").glob("*/index.html")}
    assert {f"{Path(p).stem}/index.html" for p in PAGES if p.startswith("docs/") and p != "docs/index.md"} == built


def test_the_reference_lists_the_components_lightning_rl_components_prints(capsys, monkeypatch):
    from lightning_rl.command import entry

    (command,) = bash_block("docs/reference.md", "## Components", 0)
    documented = re.search(r"prints\n\n```text\n(.*?)```", _text("docs/reference.md"), flags=re.S).group(1)
    monkeypatch.setattr("sys.argv", shlex.split(command))
    monkeypatch.setattr("sys.path", list(sys.path))  # entry() moves the working folder to its end
    entry()
    assert documented == capsys.readouterr().out


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(command: str, printed_port: str, port: int, cwd: Path, python: str = sys.executable) -> subprocess.Popen:
    """A documented server command on a free port (the printed one may be taken on a shared machine), its interpreter
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
def test_the_asynchronous_cpu_route_as_printed(scratch, run):
    server_command, fit = bash_block("docs/servers.md", "On a CPU, without SGLang", 0)
    assert shlex.split(server_command)[:3] == ["python", "-m", "tests.fixtures.sglang_server"]
    port = _free_port()
    server = _start(server_command, "30000", port, scratch)
    try:
        _wait_listening(port, server)
        printed = run(f"{fit} --model.rollout.init_args.servers.urls=[http://127.0.0.1:{port}]")
    finally:
        _stop(server)
    assert "samples at iteration 1" in printed
    (trained,) = (scratch / "runs" / "grpo").glob("version_*")
    assert _last_step(trained) == 2


@pytest.mark.slow
def test_the_sglang_teacher_commands_as_printed(scratch, run):
    """The loopback server in SGLang's place, serving the shipped teacher, and a distillation fit scored by it."""
    server_command, fit = bash_block("docs/distillation.md", "## A teacher on a server", 1)[:2]
    port = _free_port()
    server = _start(server_command, "30001", port, scratch)
    try:
        _wait_listening(port, server)
        run(f"{fit} --model.teacher.init_args.servers.urls=[http://127.0.0.1:{port}]")
    finally:
        _stop(server)
    (distilled,) = (scratch / "runs" / "distill").glob("version_*")
    assert "class_path: components.teacher.SGLangTeacher" in (distilled / "config.yaml").read_text()
    assert _last_step(distilled) == 2


def _real_vllm() -> None:
    from tests.fixtures.vllm_server import unavailable

    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no real vLLM server: {reason}")


@pytest.mark.soak
@pytest.mark.slow
@pytest.mark.xdist_group("vllm")
def test_the_vllm_teacher_commands_as_printed(scratch, run):
    """A fit that launches vLLM on the shipped teacher, then a plain vLLM server and a fit scored by its
    /v1/completions."""
    from components.rollout.vllm.environment import vllm_python
    from tests.fixtures.vllm_server import healthy

    _real_vllm()
    (launched,) = bash_block("docs/distillation.md", "## A teacher on a server", 0)
    run(launched)
    server_command, fit = bash_block("docs/distillation.md", "## A teacher on a server", 1)[2:]
    port = _free_port()
    server = _start(server_command, "8001", port, scratch, python=vllm_python())
    try:
        deadline = time.monotonic() + 600
        while not healthy(f"http://127.0.0.1:{port}"):
            assert server.poll() is None and time.monotonic() < deadline, server.stdout.read()[-3000:]
            time.sleep(1.0)
        run(f"{fit} --model.teacher.init_args.servers.urls=[http://127.0.0.1:{port}]")
    finally:
        _stop(server)
    runs = sorted((scratch / "runs" / "distill").glob("version_*"))
    assert [
        ("VLLMTeacher" in c, "CompletionsTeacher" in c) for c in (r.joinpath("config.yaml").read_text() for r in runs)
    ] == [(True, False), (False, True)]
    assert all(_last_step(r) == 2 for r in runs)


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.xdist_group("vllm")
def test_the_vllm_rollout_as_printed(scratch, run):
    """`make vllm-env` (which `make test` has run: the environment is there), then GRPO sampled by a launched vLLM."""
    make, fit = bash_block("docs/servers.md", "## vLLM rollout", 0)
    assert make == "make vllm-env" and "vllm-env:" in (ROOT / "Makefile").read_text()
    _real_vllm()
    run(fit)
    (trained,) = (scratch / "runs" / "grpo").glob("version_*")
    assert "components.rollout.VLLMRollout" in (trained / "config.yaml").read_text() and _last_step(trained) == 2
