"""docs/writing-a-component.md runs: each code block whose first line names a file (``# my_project/x.py``) is written
there, its tests run, its configs build the components they name, and the three together train two iterations."""

from __future__ import annotations

import importlib
import re
import shlex
import sys
from pathlib import Path

import pytest

from lightning_rl.cli import DEFAULT_TRAINER_CONFIG, main

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "writing-a-component.md"
BLOCK = re.compile(r"```(python|yaml)\n# (my_project/[\w./]+)\n(.*?)```", re.S)
CONFIGS = ["my_project/median.yaml", "my_project/closeness.yaml", "my_project/second_chance.yaml"]


def blocks() -> dict[str, str]:
    """The guide's files: path -> text (the naming comment kept in Python, dropped in YAML)."""
    found = {
        path: (f"# {path}\n{body}" if kind == "python" else body)
        for kind, path, body in BLOCK.findall(GUIDE.read_text())
    }
    return found


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The guide's files under ``tmp_path``, importable as ``my_project`` (and forgotten afterwards)."""
    for path, text in blocks().items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / "my_project" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n == "my_project" or n.startswith("my_project.")]:
        del sys.modules[name]


def test_the_guide_holds_a_class_a_test_and_a_config_for_each_of_the_three():
    assert sorted(blocks()) == sorted(
        [
            "my_project/advantages.py",
            "my_project/test_advantages.py",
            "my_project/rewards.py",
            "my_project/test_rewards.py",
            "my_project/environments.py",
            "my_project/test_environments.py",
            *CONFIGS,
        ]
    )
    text = GUIDE.read_text()
    for config in CONFIGS:  # the command the guide gives names each config
        assert f"--config {config}" in text


@pytest.mark.parametrize("tests", ["test_advantages", "test_rewards", "test_environments"])
def test_the_guides_tests_pass(project, tests):
    module = importlib.import_module(f"my_project.{tests}")
    functions = [getattr(module, name) for name in dir(module) if name.startswith("test_")]
    assert len(functions) >= 2
    for function in functions:
        function()


def test_the_guides_configs_build_its_components(project):
    cli = main(
        ["--config", DEFAULT_TRAINER_CONFIG, "--config", str(ROOT / "configs" / "agent_calc.yaml")]
        + [a for c in CONFIGS for a in ("--config", str(project / c))]
        + [f"--model.policy.path={ROOT / 'lightning_rl/assets/tiny-calc'}", "--trainer.logger=false"],
        run=False,
    )
    model = cli.model
    assert (
        type(model.advantage).__module__ + "." + type(model.advantage).__name__
        == "my_project.advantages.MedianBaseline"
    )
    assert type(model.reward).__name__ == "NumericCloseness" and model.reward.scale == 10.0
    assert type(model.agent.env).__name__ == "SecondChance" and model.agent.env.max_tries == 2
    assert model.advantage.whiten == "none"


def the_guides_command() -> list[str]:
    """The arguments of the guide's ``lightning-rl fit`` command (its ```bash block after "All three in one run")."""
    text = GUIDE.read_text()
    block = re.search(r"```bash\n(.*?)```", text[text.index("All three in one run") :], re.S).group(1)
    words = shlex.split(block.replace("\\\n", " "))
    assert words[:2] == ["lightning-rl", "fit"], words
    return words[2:]


@pytest.mark.slow
def test_the_three_train_together(project, tmp_path):
    """The guide's command, for two iterations: agent_calc with the guide's estimator, reward and environment;
    global_step counts them, and the logged reward is a closeness in [0, 1]."""
    command = the_guides_command()
    assert command == ["--config", "configs/agent_calc.yaml"] + [a for c in CONFIGS for a in ("--config", c)]
    # the guide runs from the repository with my_project/ in it: here the repository's files and tmp_path's project
    args = ["--config", DEFAULT_TRAINER_CONFIG]
    args += [
        str(project / a) if a.startswith("my_project/") else str(ROOT / a) if a.endswith(".yaml") else a
        for a in command
    ]
    args += [
        f"--model.policy.path={ROOT / 'lightning_rl/assets/tiny-calc'}",
        "--data.batch_size=2",
        "--data.val_size=4",
        "--trainer.max_steps=2",
        "--trainer.limit_val_batches=0",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.callbacks=[]",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={tmp_path / 'run'}",
    ]
    cli = main(args, run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2
    reward = float(cli.trainer.callback_metrics["reward/mean"])
    assert 0.0 <= reward <= 1.0
