"""Bad input gets one clear message naming the culprit and the fix."""

import json

import pytest

from lightning_rl.cli import main
from lightning_rl.data import PromptDataModule

from .cli_runs import cli_args, run_cli


def test_unknown_component_class(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--model.reward=components.reward.NoSuchReward", "--print_config"])
    assert "NoSuchReward" in capsys.readouterr().err


def test_missing_model_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model.policy.path.*/no/such/model.*does not exist"):
        run_cli("fit", cli_args(tmp_path, "/no/such/model", 1))


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


def test_dataset_column_not_found(tmp_path, tiny_model_path):
    data = _jsonl(tmp_path / "d.jsonl", [{"question": "1+1=", "gold": "2"}])
    dm = PromptDataModule(train_data=data, val_data=None, tokenizer=tiny_model_path)
    with pytest.raises(KeyError, match=r"column 'prompt' \(data.columns.prompt\) not found.*\['question', 'gold'\]"):
        dm.setup("fit")
    renamed = PromptDataModule(train_data=data, val_data=None, tokenizer=tiny_model_path, columns={"prompt": "question", "answer": "gold"}, batch_size=1)
    renamed.setup("fit")
    batch = next(iter(renamed.train_dataloader()))
    assert batch["meta"]["answer"] == ["2"] and batch["meta"]["prompt"] == ["1+1="]


@pytest.mark.parametrize("policy", ["error", "truncate", "drop"])
def test_prompt_longer_than_the_maximum(tmp_path, tiny_model_path, policy):
    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1=", "answer": "2"}, {"prompt": "12345678+1=", "answer": "12345679"}])
    dm = PromptDataModule(train_data=data, val_data=None, tokenizer=tiny_model_path, max_prompt_length=6, overlong_prompt=policy, batch_size=1)
    if policy == "error":
        with pytest.raises(ValueError, match=r"longer than data.max_prompt_length=6.*row 1 has 11.*overlong_prompt"):
            dm.setup("fit")
        return
    if policy == "drop":
        with pytest.warns(UserWarning, match="dropping 1 prompt"):
            dm.setup("fit")
        assert len(dm.train_rows) == 1
    else:
        dm.setup("fit")
        assert [len(x) for x in dm.train_rows["input_ids"]] == [4, 6]  # the last 6 tokens are kept


def test_missing_data_file(tmp_path, tiny_model_path):
    dm = PromptDataModule(train_data=str(tmp_path / "nope.jsonl"), val_data=None, tokenizer=tiny_model_path)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        dm.setup("fit")


@pytest.mark.parametrize(
    "fn, error, message",
    [
        ("always_fails", RuntimeError, r"always_fails\) raised ValueError: the answer key is corrupt"),
        ("returns_nan", ValueError, r"returns_nan.*returned nan at sample 0.*finite number"),
        ("returns_none", ValueError, r"returns_none.*returned None at sample 0"),
        ("wrong_length", ValueError, r"wrong_length.*must return 4 scores"),
    ],
)
def test_bad_reward_functions(tmp_path, tiny_model_path, fn, error, message):
    args = cli_args(tmp_path, tiny_model_path, 1, "--model.reward=components.reward.FunctionReward", f"--model.reward.fn=tests.lightning_rl.rewards.{fn}", "--model.rollout.init_args.group_size=2")
    with pytest.raises(error, match=message):
        run_cli("fit", args)


def test_gae_without_critic_fails_before_any_model_loads():
    from components.critic import ValueCritic  # noqa: F401  (the hint names it)
    from lightning_rl.module import RLModule

    class NeedsValues:
        requires = frozenset({"values", "token_rewards"})

    with pytest.raises(ValueError, match=r"needs \['values'\].*components.critic.ValueCritic"):
        RLModule(advantage=NeedsValues())
