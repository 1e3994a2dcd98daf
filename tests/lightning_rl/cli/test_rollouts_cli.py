"""The command line of rollout records: ``fit --record_rollouts``, ``lightning-rl rollouts show`` and what
``lightning-rl replay`` decides before it trains (its config, which settings differ from the recorded run's)."""

from __future__ import annotations

import sys

import pytest
import torch
import yaml

from lightning_rl.callbacks import RecordRollouts
from lightning_rl.cli.replay import changed_settings, trainer_settings, with_recorded_config
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.rollouts import RecordedIteration
from lightning_rl.rollouts.iteration import write_iteration


def iteration(n: int, version: int) -> RecordedIteration:
    """Two prompts x 2 samples, sampled by version 0 and trained by ``version``."""
    batch = RolloutBatch(
        response_ids=torch.tensor([[5, 6, 0], [5, 7, 8], [9, 0, 0], [9, 9, 0]]),
        response_mask=torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]]),
        prompt_ids=torch.tensor([[1, 2], [1, 2], [3, 4], [3, 4]]),
        prompt_mask=torch.ones(4, 2, dtype=torch.long),
        truncated=torch.tensor([False, True, False, False]),
        group_ids=torch.tensor([0, 0, 1, 1]),
        scores=torch.tensor([1.0, 0.0, 0.5, 0.5]) * n,
        versions=torch.zeros(4, dtype=torch.long),
        advantages=torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
        columns={"prompts": ["12+1=", "12+1=", "3+4=", "3+4="], "completions": ["13", "2x1", "7", "77"]},
        score_parts={"accuracy": torch.tensor([1.0, 0.0, 1.0, 0.0])},
    )
    collected = ("response_ids", "response_mask", "prompt_ids", "prompt_mask", "truncated", "group_ids", "scores")
    return RecordedIteration(iteration=n, batch=batch, collected=(*collected, "versions", "columns"), version=version)


@pytest.fixture
def record(tmp_path):
    for n in (1, 2):
        write_iteration(iteration(n, version=n - 1), tmp_path, "test")
    return tmp_path


def show(monkeypatch, capsys, *args: str) -> str:
    from lightning_rl.command import entry

    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr("sys.argv", ["lightning-rl", "rollouts", "show", *args])
    monkeypatch.setattr("sys.path", list(sys.path))
    entry()
    return capsys.readouterr().out


def test_rollouts_show_lists_each_iteration_with_its_version_staleness_and_reward(record, monkeypatch, capsys):
    out = show(monkeypatch, capsys, str(record))
    assert "2 iterations, 1 rank(s)" in out
    rows = [line.split("│")[1:-1] for line in out.splitlines() if line.startswith("│")]
    cells = [[c.strip() for c in row] for row in rows]
    # iteration, samples, version, staleness, reward mean, length mean, truncated, KiB
    assert [c[:7] for c in cells] == [
        ["1", "4", "0", "0..0", "0.5", "2", "0.25"],
        ["2", "4", "1", "1..1", "1", "2", "0.25"],
    ]


def test_rollouts_show_of_an_iteration_prints_its_samples(record, monkeypatch, capsys):
    out = show(monkeypatch, capsys, str(record), "--iteration", "2")
    assert "iteration 2 (rank 0): 4 samples trained by policy version 1, staleness 1..1" in out
    assert "computed by the trainer: advantages, score_parts" in out
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│")]
    header = [c.strip() for c in out.split("┃")[1:10]]
    assert header == ["#", "group", "prompt", "response", "reward", "accuracy", "advantage", "version", "stale"]
    # sample 1: 12+1= -> 2x1, reward 0 * 2, advantage -1 over its 3 tokens, sampled by version 0 and trained by 1
    assert rows[1] == ["1", "0", "12+1=", "2x1", "0", "0", "-1", "0", "1"]
    assert rows[0][4] == "2" and rows[0][6] == "1"  # 1 x iteration 2; +1 on its 2 tokens, not on the padding
    assert "samples 0..1 (2 more: --rows 0 shows all)" in show(
        monkeypatch, capsys, str(record), "--iteration", "1", "--rows", "2"
    )
    # one file alone shows its own iteration
    assert "iteration 1 (rank 0)" in show(monkeypatch, capsys, str(record / "iteration_000001.parquet"))


def test_record_rollouts_is_a_flag_of_fit_and_a_key_of_a_config(tmp_path, tiny_model_path, capsys):
    from lightning_rl.cli import main

    with pytest.raises(SystemExit):
        main(["fit", "--record_rollouts.keep_last=2", "--print_config"])
    assert yaml.safe_load(capsys.readouterr().out)["record_rollouts"] == {
        "class_path": "lightning_rl.callbacks.RecordRollouts",
        "init_args": {"keep_last": 2},
    }
    config = tmp_path / "config.yaml"
    config.write_text("record_rollouts: true\n")
    where = [f"--model.policy.path={tiny_model_path}", f"--trainer.logger.init_args.save_dir={tmp_path}", "--dry_run"]
    for args, kept in (
        (["--config", str(config)], None),
        (["--record_rollouts", "{keep_last: 3}"], 3),
        (["--record_rollouts=false"], "off"),
    ):
        cli = main(["fit", *args, *where])
        recorders = [c for c in cli.trainer.callbacks if isinstance(c, RecordRollouts)]
        out = capsys.readouterr().out
        if kept == "off":
            assert not recorders and "rollouts " not in out
            continue
        assert [r.keep_last for r in recorders] == [kept]
        assert f"  rollouts     {tmp_path}/default/version_<next>/rollouts" in out
    assert "(the last 3 iterations; lightning-rl replay --rollouts trains from it)" in out or kept == "off"
    with pytest.raises(ValueError, match="keep_last=0 must be >= 1"):
        RecordRollouts(keep_last=0)


def test_the_python_trainer_records_as_fit_does():
    import lightning_rl

    trainer = lightning_rl.Trainer(record_rollouts=RecordRollouts(keep_last=5), logger=False)
    (recorder,) = [c for c in trainer.callbacks if isinstance(c, RecordRollouts)]
    assert recorder.keep_last == 5
    assert [
        c for c in lightning_rl.Trainer(record_rollouts=True, logger=False).callbacks if isinstance(c, RecordRollouts)
    ]
    assert not [c for c in lightning_rl.Trainer(logger=False).callbacks if isinstance(c, RecordRollouts)]


def test_replay_takes_the_records_config_unless_given_one(tmp_path):
    (tmp_path / "config.yaml").write_text("model: {}\n")
    assert with_recorded_config(["--rollouts", str(tmp_path)]) == [
        "--config", str(tmp_path / "config.yaml"), "--rollouts", str(tmp_path),
    ]  # fmt: skip
    assert with_recorded_config([f"--rollouts={tmp_path}", "--x=1"])[:2] == ["--config", str(tmp_path / "config.yaml")]
    given = ["--config", "mine.yaml", "--rollouts", str(tmp_path)]
    assert with_recorded_config(given) == given
    assert with_recorded_config(["--rollouts", str(tmp_path / "none")]) == ["--rollouts", str(tmp_path / "none")]


def test_replay_stops_at_the_records_last_iteration_and_does_not_validate(record):
    assert trainer_settings({"rollouts": str(record), "trainer": {"max_steps": 200}}) == {
        "max_steps": 2,
        "limit_val_batches": 0,
    }
    assert trainer_settings({"rollouts": str(record), "trainer": {"max_steps": 1}})["max_steps"] == 1
    assert trainer_settings({"rollouts": str(record), "trainer": {"max_steps": -1}})["max_steps"] == 2


def test_the_settings_that_train_otherwise_are_named_and_the_samplers_are_not():
    recorded = {
        "seed_everything": 0,
        "model": {
            "advantage": {"class_path": "components.advantage.GroupNormalized", "init_args": {"scale": "group"}},
            "rollout": {"init_args": {"temperature": 1.0}},
            "reward": {"class_path": "components.reward.ExactMatch"},
            "optimizer": {"lr": 1e-4},
            "loop": {"ppo_epochs": 1, "log_samples": 4},
        },
        "trainer": {"precision": "32-true", "max_steps": 200, "logger": {"save_dir": "runs"}},
        "data": {"batch_size": 16},
        "record_rollouts": True,
        "ckpt_path": None,
    }
    same = yaml.safe_load(yaml.safe_dump(recorded))
    same["model"]["rollout"]["init_args"]["temperature"] = 3.0  # the sampler: nothing a replay runs
    same["model"]["reward"] = {"class_path": "components.reward.FunctionReward"}
    same["model"]["loop"]["log_samples"] = 8
    same["trainer"].update(max_steps=3, logger={"save_dir": "elsewhere"})
    same.update(data={"batch_size": 2}, record_rollouts=False, ckpt_path="x.ckpt", rollouts="runs/x/rollouts")
    assert changed_settings(recorded, same) == []
    other = yaml.safe_load(yaml.safe_dump(same))
    other["model"]["advantage"]["class_path"] = "components.advantage.LeaveOneOut"
    other["model"]["optimizer"]["lr"] = 3e-4
    other["trainer"]["precision"] = "bf16-mixed"
    other["seed_everything"] = 1
    assert changed_settings(recorded, other) == [
        "model.advantage.class_path",
        "model.optimizer.lr",
        "seed_everything",
        "trainer.precision",
    ]
