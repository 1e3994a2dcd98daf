"""Bad input gets one clear message naming the culprit and the fix."""

import json
import sys

import pytest

from lightning_rl.cli import main
from lightning_rl.data.prompts import PromptDataModule

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
    renamed = PromptDataModule(
        train_data=data,
        val_data=None,
        tokenizer=tiny_model_path,
        columns={"prompt": "question", "answer": "gold"},
        batch_size=1,
    )
    renamed.setup("fit")
    batch = next(iter(renamed.train_dataloader()))
    assert batch["prompts"].columns["answer"] == ["2"] and batch["prompts"].columns["prompt"] == ["1+1="]


def test_a_row_without_its_prompt_names_the_file_line_and_column(tmp_path, tiny_model_path):
    from lightning_rl.data.checks import DataError

    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1=", "gold": "2"}\n\n{"gold": "4"}\n{"question": "3+3=", "gold": "6"}\n')
    dm = PromptDataModule(
        train_data=str(data), val_data=None, tokenizer=tiny_model_path, columns={"prompt": "question"}
    )
    with pytest.raises(
        DataError,
        match=r"d\.jsonl, row 1 \(line 3\): has no prompt text in column 'question' \(data.columns.prompt\); 1 of 3",
    ):
        dm.setup("fit")


def test_a_bad_row_is_one_line_from_the_command_line(tmp_path, tiny_model_path, monkeypatch, capsys):
    from lightning_rl.cli import entry

    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1=", "answer": "2"}, {"prompt": 7, "answer": "4"}])
    args = cli_args(
        tmp_path, tiny_model_path, 1, f"--data.train_data={data}", "--data.val_data=null", "--data.batch_size=1"
    )
    monkeypatch.setattr("sys.argv", ["lightning-rl", "fit", *args])
    monkeypatch.setattr("sys.path", list(sys.path))  # entry() moves the working folder to the end of it
    monkeypatch.delenv("LIGHTNING_RL_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_:
        entry()
    assert exit_.value.code == 1
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith(f"error: {data}, row 1 (line 2): has a int (7) as prompt text")
    )


def test_prompt_tokens_the_tokenizer_does_not_know_are_counted_and_warned_once(tmp_path, tiny_model_path):
    data = _jsonl(
        tmp_path / "d.jsonl",
        [
            {"prompt": "reverse 3915=", "answer": "5193"},
            {"prompt": "12+3=", "answer": "15"},
            {"prompt": "sort 21=", "answer": "12"},
        ],
    )
    dm = PromptDataModule(train_data=data, val_data=data, tokenizer=tiny_model_path, batch_size=1)
    with pytest.warns(UserWarning) as said:
        dm.setup("fit")
    unknown = [str(w.message) for w in said if "does not know" in str(w.message)]
    assert len(unknown) == 2  # once per source (train, validation), not once per prompt
    assert (
        "2 of 3 prompt(s)" in unknown[0] and "(11 <unk> of" in unknown[0]
    )  # 'reverse' (7) and 'sort' (4): the tiny vocabulary is digits and +-*=
    assert "row 0 'reverse 3915=' is read as '<unk><unk><unk><unk><unk><unk><unk> 3915='" in unknown[0]
    assert dm.unknown_tokens == {data: 11}


@pytest.mark.parametrize("policy", ["error", "truncate", "drop"])
def test_prompt_longer_than_the_maximum(tmp_path, tiny_model_path, policy):
    data = _jsonl(
        tmp_path / "d.jsonl", [{"prompt": "1+1=", "answer": "2"}, {"prompt": "12345678+1=", "answer": "12345679"}]
    )
    dm = PromptDataModule(
        train_data=data,
        val_data=None,
        tokenizer=tiny_model_path,
        max_prompt_length=6,
        overlong_prompt=policy,
        batch_size=1,
    )
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
        (
            "wrong_length",
            ValueError,
            r"wrong_length.*must return 8 scores",
        ),  # the validation before the first iteration (8 prompts) meets it first
    ],
)
def test_bad_reward_functions(tmp_path, tiny_model_path, fn, error, message):
    args = cli_args(
        tmp_path,
        tiny_model_path,
        1,
        "--model.reward=components.reward.FunctionReward",
        f"--model.reward.fn=tests.lightning_rl.rewards.{fn}",
        "--model.rollout.init_args.group_size=2",
    )
    with pytest.raises(error, match=message):
        run_cli("fit", args)


def test_gae_without_critic_fails_before_any_model_loads():
    from components.critic import ValueCritic  # noqa: F401  (the hint names it)
    from lightning_rl.loop.module import RLModule

    class NeedsValues:
        requires = frozenset({"values", "token_rewards"})

    with pytest.raises(ValueError, match=r"needs \['values'\].*components.critic.ValueCritic"):
        RLModule(advantage=NeedsValues())


@pytest.mark.parametrize(
    "content, message",
    [
        ("", r"empty\.jsonl'? is empty: a \.jsonl file needs one JSON object per line"),
        (
            '{"prompt": "1+1="}\n' * 90 + '{"prompt": "2+2=", }\n{"prompt": "3+3="}\n',
            r"bad\.jsonl, line 91: not valid JSON.*\{\"prompt\": \"2\+2=\", \}.*one complete JSON object",
        ),
        ('{"prompt": "1+1="}\n["2+2="]\n', r"bad\.jsonl, line 2: a JSON list, not an object"),
    ],
)
def test_unreadable_jsonl_names_the_file_line_and_fix(tmp_path, tiny_model_path, content, message):
    path = tmp_path / ("empty.jsonl" if not content else "bad.jsonl")
    path.write_text(content)
    dm = PromptDataModule(train_data=str(path), val_data=None, tokenizer=tiny_model_path)
    with pytest.raises(ValueError, match=message):
        dm.setup("fit")


def test_truncated_prompts_are_counted_and_context_overflow_is_warned(tmp_path, tiny_model_path):
    from transformers import AutoConfig

    from lightning_rl.loop.requirements import check_context_length

    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "1+1="}\n{"prompt": "' + "9" * 40 + '="}\n{"prompt": "' + "8" * 50 + '="}\n')
    dm = PromptDataModule(
        train_data=str(path),
        val_data=None,
        tokenizer=tiny_model_path,
        max_prompt_length=30,
        overlong_prompt="truncate",
        batch_size=1,
    )
    with pytest.warns(UserWarning, match=r"truncating 2 of 3 prompt\(s\).*to their last 30 tokens"):
        dm.setup("fit")
    assert dm.overlong_prompts == {str(path): 2} and dm.longest_prompt == 30
    config = AutoConfig.from_pretrained(tiny_model_path)  # 64 positions
    check_context_length(config, dm.longest_prompt, 30, 34)  # 64: fits, silent
    with pytest.warns(
        UserWarning,
        match=r"longest prompt \(30 tokens; data.max_prompt_length=30\) \+ model.rollout.init_args.max_new_tokens \(35\) = 65 exceeds the policy's max_position_embeddings \(64\)",
    ):
        check_context_length(config, dm.longest_prompt, 30, 35)
    with pytest.warns(
        UserWarning,
        match=r"\+ model.agent.init_args.max_total_tokens \(40\) = 70 exceeds .* or max_total_tokens so they fit",
    ):
        check_context_length(
            config, dm.longest_prompt, 30, 40, "model.agent.init_args.max_total_tokens"
        )  # an agent's whole transcript


def test_chat_template_on_a_tokenizer_without_one_names_the_option(tiny_model_path):
    from lightning_rl.data.prompts import PromptDataModule

    data = PromptDataModule(tokenizer=tiny_model_path, chat_template=True)
    with pytest.raises(ValueError, match="data.chat_template is true but the tokenizer .* has no chat template"):
        data.setup("fit")
