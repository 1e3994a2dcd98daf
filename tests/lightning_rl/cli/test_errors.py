"""Bad input gets one clear message naming the culprit and the fix."""

import json
import re
import sys
from pathlib import Path

import pytest

from lightning_rl.cli import main
from lightning_rl.core.errors import RewardError
from lightning_rl.data.prompts import PromptDataModule
from tests.lightning_rl.cli_runs import cli_args, run_cli

ROOT = Path(__file__).resolve().parents[3]
# a fit that would be short; each error below comes before it starts
QUICK = [
    "--trainer.max_steps=1",
    "--trainer.logger=false",
    "--trainer.callbacks=null",
    "--trainer.enable_checkpointing=false",
    "--trainer.enable_progress_bar=false",
    "--data.batch_size=2",
    "--data.val_size=4",
]


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model load fails the test: the error must come before."""

    def refused(*args, **kwargs):
        raise AssertionError("a model was loaded before the error")

    monkeypatch.setattr("lightning_rl.roster.load_causal_lm", refused)


@pytest.fixture
def lightning_rl(monkeypatch, capsys):
    """``lightning-rl fit ARGS`` as its console script runs it (from the repository folder unless ``cwd``): its exit
    status and its one error line, checked to be the whole of what it printed (a parser error adds the pointer to
    ``--help``)."""
    from lightning_rl.command import entry

    def run(*args: str, cwd: Path = ROOT) -> tuple[int, str]:
        monkeypatch.chdir(cwd)
        monkeypatch.setattr("sys.argv", ["lightning-rl", "fit", *args, *QUICK])
        monkeypatch.setattr("sys.path", list(sys.path))  # entry() moves the working folder to the end of it
        monkeypatch.delenv("LIGHTNING_RL_DEBUG", raising=False)
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            entry()
        printed = capsys.readouterr()
        lines = [line for line in (printed.out + printed.err).splitlines() if line.strip()]
        assert lines and lines[0].startswith("error: "), lines
        assert lines[1:] in ([], ["every option: lightning-rl fit --help"]), lines
        return exit_.value.code, lines[0]

    return run


def test_unknown_component_class(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--model.reward=components.reward.NoSuchReward", "--print_config"])
    assert "NoSuchReward" in capsys.readouterr().err


def test_missing_model_path(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LIGHTNING_RL_DEBUG", raising=False)
    with pytest.raises(SystemExit):  # at construction, before any model loads
        run_cli("fit", cli_args(tmp_path, "/no/such/model", 1))
    assert "model.policy.path: model path '/no/such/model' does not exist" in capsys.readouterr().err


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


def test_dataset_column_not_found(tmp_path, tiny_model_path):
    data = _jsonl(tmp_path / "d.jsonl", [{"question": "1+1=", "gold": "2"}])
    dm = PromptDataModule(train_data=data, val_data=None, tokenizer=tiny_model_path)
    from lightning_rl.data.checks import DataError

    with pytest.raises(
        DataError, match=r"no column 'prompt' \(data.columns.prompt\); its columns are \['question', 'gold'\]"
    ):
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
    from lightning_rl.command import entry

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


def test_a_missing_data_file_is_one_line_with_the_closest_existing_path(lightning_rl, no_model_loads, tmp_path):
    (tmp_path / "data").mkdir()
    _jsonl(tmp_path / "data" / "train.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    code, line = lightning_rl("--data.train_data=data/trian.jsonl", "--data.val_data=null", cwd=tmp_path)
    assert code == 1 and line == "error: data file 'data/trian.jsonl' does not exist (did you mean 'data/train.jsonl'?)"


@pytest.mark.parametrize(
    "fn, error, message",
    [
        ("always_fails", RewardError, r"always_fails\) failed at row 0 of 8 .*: ValueError: the answer key is corrupt"),
        ("returns_nan", RewardError, r"returns_nan\) failed at row 0 of 8 .*: it returned nan, not a finite number"),
        ("returns_none", RewardError, r"returns_none\) failed at row 0 of 8 .*: it returned None, not a finite number"),
        (
            "wrong_length",
            RewardError,
            r"wrong_length.*must return 8 scores.*on no row alone",
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
    from lightning_rl.core.contracts import AdvantageEstimator
    from lightning_rl.loop.module import RLModule

    class NeedsValues(AdvantageEstimator):
        requires = frozenset({"values", "token_rewards"})

        def estimate(self, batch):
            raise AssertionError("the config fails before any batch")

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

    from lightning_rl.callbacks.context_length import check_context_length

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


# ---------------------------------------------------------------------------------------------- one line, with the fix


def test_a_mistyped_agent_function_is_one_line_with_the_closest_name_before_any_model_loads(
    lightning_rl, no_model_loads
):
    code, line = lightning_rl(
        "--config", "configs/openai_agent.yaml", "--model.agent.init_args.function=examples.openai_calc_agent.agnt"
    )
    assert code == 2 and line == (
        "error: model.agent.init_args.function: cannot import examples.openai_calc_agent.agnt: "
        "'examples.openai_calc_agent' has no 'agnt' (did you mean examples.openai_calc_agent.agent?); "
        "give the dotted path of agent(client, row), importable from the folder you run in"
    )
    code, line = lightning_rl(
        "--config", "configs/openai_agent.yaml", "--model.agent.init_args.function=examples.openai_calc_agnt.agent"
    )
    assert code == 2 and "'examples' has no 'openai_calc_agnt' (did you mean examples.openai_calc_agent.agent?)" in line


def test_an_agent_module_outside_the_working_folder_says_so(lightning_rl, no_model_loads, tmp_path, monkeypatch):
    # as a shell in another folder has it: the repository is not on the import path (pytest puts it there)
    monkeypatch.setattr("sys.path", [p for p in sys.path if Path(p or ".").resolve() != ROOT])
    for name in [n for n in sys.modules if n == "examples" or n.startswith("examples.")]:
        monkeypatch.delitem(sys.modules, name)
    code, line = lightning_rl("--config", str(ROOT / "configs/openai_agent.yaml"), cwd=tmp_path)
    assert code == 2 and line.startswith(
        "error: model.agent.init_args.function: cannot import examples.openai_calc_agent.agent: no module 'examples'; "
        "give the dotted path of agent(client, row), importable from the folder you run in"
    )


def test_a_mistyped_reward_function_is_one_line_with_the_closest_name(lightning_rl, no_model_loads):
    code, line = lightning_rl(
        "--model.reward=components.reward.FunctionReward", "--model.reward.fn=tests.lightning_rl.rewards.digit_cont"
    )
    assert code == 2 and line == (
        "error: model.reward.init_args.fn: cannot import tests.lightning_rl.rewards.digit_cont: "
        "'tests.lightning_rl.rewards' has no 'digit_cont' (did you mean tests.lightning_rl.rewards.digit_count?); "
        "give the dotted path of a function, importable from the folder you run in"
    )


def test_a_mistyped_environment_class_in_a_yaml_is_one_line_with_the_closest_class(
    lightning_rl, no_model_loads, tmp_path
):
    config = tmp_path / "env.yaml"
    config.write_text(
        "model:\n  agent:\n    class_path: components.rollout.MultiTurnRollout\n    init_args:\n      env:\n"
        "        class_path: components.env.ToolEnvironmnt\n"
        "        init_args: {tools: [{class_path: components.env.Calculator}]}\n"
    )
    code, line = lightning_rl("--config", "configs/agent_calc.yaml", "--config", str(config))
    assert code == 2 and line == (
        "error: model.agent.init_args.env: cannot import components.env.ToolEnvironmnt: 'components.env' has no "
        "'ToolEnvironmnt' (did you mean components.env.ToolEnvironment?); give a class: `lightning-rl components` "
        "lists ours; yours import from the folder you run in"
    )


def test_a_mistyped_verifiers_environment_is_one_line_with_the_closest_name(lightning_rl, no_model_loads):
    pytest.importorskip("verifiers")
    code, line = lightning_rl(
        "--config",
        "configs/openai_agent.yaml",
        "--model.agent=components.rollout.VerifiersAgent",
        "--model.agent.init_args.environment=examples.verifiers_calc_env.load_enviroment",
    )
    assert code == 2 and line.startswith(
        "error: model.agent.init_args.environment: cannot import examples.verifiers_calc_env.load_enviroment: "
        "'examples.verifiers_calc_env' has no 'load_enviroment' (did you mean "
        "examples.verifiers_calc_env.load_environment?); give the dotted path of a function that returns a verifiers "
        "Environment"
    )


def test_a_column_missing_from_every_row_is_one_line_with_the_mapping_that_fixes_it(
    lightning_rl, no_model_loads, tmp_path
):
    data = _jsonl(tmp_path / "d.jsonl", [{"question": "1+1=", "answer": "2"}, {"question": "2+2=", "answer": "4"}])
    code, line = lightning_rl(f"--data.train_data={data}", "--data.val_data=null")
    assert code == 1 and line == (
        f"error: {data} has no column 'prompt' (data.columns.prompt); its columns are ['question', 'answer']: "
        "map it with data.columns: {prompt: <column>}"
    )
    code, line = lightning_rl(f"--data.train_data={data}", "--data.val_data=null", "--data.columns={prompt: questoin}")
    assert code == 1 and line == (
        f"error: {data} has no column 'questoin' (data.columns.prompt; did you mean 'question'?); its columns are "
        "['question', 'answer']: map it with data.columns: {prompt: question}"
    )


def test_a_column_the_reward_reads_and_no_row_has_is_one_line_before_any_model_loads(
    lightning_rl, no_model_loads, tmp_path
):
    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1=", "answers": "2"}, {"prompt": "2+2=", "answers": "4"}])
    code, line = lightning_rl(f"--data.train_data={data}", "--data.val_data=null")
    assert code == 1 and line == (
        f"error: model.reward (ExactMatch) reads the column 'answer', which {data} does not have (did you mean "
        "'answers'?); its columns are ['prompt', 'answers']: map it with data.columns: {answer: answers}"
    )


def test_a_trl_style_reward_over_a_mapped_column_is_one_line_before_any_model_loads(
    lightning_rl, no_model_loads, tmp_path
):
    """A TRL user's reward reads the data's own column name; ``data.columns: {answer: solution}`` hands it ``answer``.
    The run said so with a 93-line trace after the model loaded; now one line names the column, the name it arrives
    under and the two fixes, before any model loads."""
    data = _jsonl(tmp_path / "d.jsonl", [{"question": "1+1=", "solution": "2"}, {"question": "2+2=", "solution": "4"}])
    mapped = ["--data.columns={prompt: question, answer: solution}", "--model.reward=components.reward.FunctionReward"]
    code, line = lightning_rl(
        f"--data.train_data={data}",
        "--data.val_data=null",
        *mapped,
        "--model.reward.fn=tests.lightning_rl.rewards.trl_correct",
    )
    assert code == 1 and line == (
        "error: model.reward (FunctionReward(tests.lightning_rl.rewards.trl_correct)) reads the column 'solution', which "
        "reaches a reward as 'answer': data.columns maps {answer: solution}, and a reward gets each column under its "
        "data.columns name. Read 'answer' instead (a reward function: name its parameter answer), or keep the column's "
        "own name with data.columns: {solution: solution} in place of {answer: solution}"
    )
    # a column the data does not have at all: the closest one and the mapping
    code, line = lightning_rl(
        f"--data.train_data={data}", "--data.val_data=null", "--data.columns={prompt: question}", *mapped[1:],
        "--model.reward.fn=tests.lightning_rl.rewards.trl_correct_answer",
    )  # fmt: skip
    assert code == 1 and line == (
        "error: model.reward (FunctionReward(tests.lightning_rl.rewards.trl_correct_answer)) reads the column 'answer', "
        f"which {data} does not have; its columns are ['prompt', 'solution']: map it with data.columns: "
        "{answer: <column>}"
    )


def test_an_argument_a_component_does_not_take_lists_what_it_takes(lightning_rl, no_model_loads):
    code, line = lightning_rl(
        "--model.reward=components.reward.FunctionReward",
        "--model.reward.function=tests.lightning_rl.rewards.digit_count",
    )
    assert code == 2 and line.endswith(
        "Option 'function' is not accepted (function -> did you mean fn?; FunctionReward takes fn: Callable[..., Any] "
        "(required), kwargs: dict[str, Any] | None = None, timeout_s: float | None = 600.0, on_failure: "
        "Literal['raise', 'score'] = 'raise', failure_score: float = 0.0)"
    )


def test_a_mistyped_policy_path_is_one_line_with_the_closest_folder(lightning_rl, no_model_loads, tmp_path):
    code, line = lightning_rl("--model.policy.path=lightning_rl/assets/tiny-arth")
    assert code == 2 and line == (
        "error: model.policy.path: model path 'lightning_rl/assets/tiny-arth' does not exist (did you mean "
        "'lightning_rl/assets/tiny-arith'?); set it to a local save_pretrained() directory or a hub id (namespace/name)"
    )
    # a preset's shipped model, run from another folder: where the folder is
    code, line = lightning_rl("--config", str(ROOT / "configs/agent_calc.yaml"), cwd=tmp_path)
    assert code == 2 and line == (
        f"error: model.policy.path: model path 'lightning_rl/assets/tiny-calc' does not exist in {tmp_path}; it is "
        f"in {ROOT}: run from there, or give {ROOT / 'lightning_rl/assets/tiny-calc'}; set it to a local "
        "save_pretrained() directory or a hub id (namespace/name)"
    )


def test_a_verifiers_agent_on_a_policy_without_a_chat_template_is_refused_at_setup(lightning_rl, tmp_path):
    """Every model call of a verifiers environment is a chat completion: without a template each was refused, and the
    run exited 0 having trained on nothing (reward 0)."""
    pytest.importorskip("verifiers")
    env = "examples.verifiers_calc_env.load_environment"
    code, line = lightning_rl(
        "--config",
        "configs/openai_agent.yaml",
        "--model.policy.path=lightning_rl/assets/tiny-arith",
        "--model.agent=components.rollout.VerifiersAgent",
        f"--model.agent.init_args.environment={env}",
        "--model.agent.init_args.chat_template=null",
        f"--data.train_data=verifiers:{env}",
        f"--data.val_data=verifiers:{env}",
        "--model.reward=components.reward.ResultScore",
        "--model.reward.key=reward",
    )
    assert code == 1 and line == (
        "error: model.agent (VerifiersAgent): the tokenizer of model.policy.path (lightning_rl/assets/tiny-arith) has "
        "no chat template, and a verifiers environment calls the model only through /v1/chat/completions: set "
        "model.agent.init_args.chat_template (a Jinja template, or a file holding one), or use a chat model"
    )


def test_a_teacher_whose_tokenizer_differs_is_one_line_with_the_fix(monkeypatch, capsys):
    """`lightning-rl distill` with a teacher of another vocabulary: refused when the models are built, in one line
    naming the key, both vocabularies and the fix (it was a ValueError's traceback)."""
    from lightning_rl.command import entry

    monkeypatch.chdir(ROOT)
    argv = ["lightning-rl", "distill", "--model.teacher.init_args.path=lightning_rl/assets/tiny-calc", *QUICK]
    monkeypatch.setattr("sys.argv", argv)
    monkeypatch.setattr("sys.path", list(sys.path))  # entry() moves the working folder to the end of it
    monkeypatch.delenv("LIGHTNING_RL_DEBUG", raising=False)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        entry()
    printed = capsys.readouterr()
    lines = [line for line in (printed.out + printed.err).splitlines() if line.strip()]
    assert exit_.value.code == 1 and lines == [
        "error: model.teacher.init_args.path: the teacher's tokenizer (lightning_rl/assets/tiny-calc) differs from the "
        "policy's: its vocabulary has 22 tokens, the policy's 18 (the teacher's has tokens the policy never samples). "
        "The teacher scores the policy's token ids as they are: use a teacher trained with the policy's tokenizer"
    ]


@pytest.mark.parametrize(
    "path, closest",
    [
        ("components.env.ToolEnvironmnt", "components.env.ToolEnvironment"),
        ("componentz.reward.ExactMatch", "components.reward.ExactMatch"),
        ("components.rewardz.ExactMatc", "components.reward.ExactMatch"),  # two names corrected in turn
        ("components.reward.NoSuchThingAtAll", None),
        ("components.reward.ExactMatch", "components.reward.ExactMatch"),
    ],
)
def test_closest_dotted_corrects_each_name_by_what_its_prefix_holds(path, closest):
    from lightning_rl.core.errors import closest_dotted

    assert closest_dotted(path) == closest


def test_closest_path_corrects_each_folder_by_its_siblings(tmp_path, monkeypatch):
    from lightning_rl.core.errors import closest_path

    (tmp_path / "models" / "qwen-0.5b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert closest_path("modles/qwen-0.5") == "models/qwen-0.5b"
    assert closest_path(str(tmp_path / "models" / "qwen-05b")) == str(tmp_path / "models" / "qwen-0.5b")
    assert closest_path("elsewhere/entirely") is None


@pytest.mark.slow
def test_a_reward_that_raises_on_some_rows_is_one_line_with_the_option_and_the_option_goes_on(
    tmp_path, tiny_model_path, monkeypatch, capsys, caplog
):
    """A TRL-style reward over a mapped column runs; when it raises on the rows of one prompt (iteration 2 of 3, the
    prompts in file order) the console shows the resume line, where the trace is, and one error line naming the
    function, the exception, the row and the option; with ``on_failure: score`` the run goes on and counts the rows."""
    from lightning_rl.command import entry
    from tests.lightning_rl.cli_runs import scalars

    problems = ["1+1=", "2+2=", "3+3=", "4+4=", "5+5=", "6+6=", "7+7=", "8+8="]
    data = _jsonl(tmp_path / "d.jsonl", [{"question": q, "solution": str(2 * (i + 1))} for i, q in enumerate(problems)])

    def fit(root: Path, *extra: str) -> tuple[int, list[str]]:
        args = cli_args(root, tiny_model_path, 3, "--model.rollout.init_args.group_size=2", "--data.val_data=null")
        monkeypatch.setattr("sys.argv", ["lightning-rl", "fit", *args, f"--data.train_data={data}", "--data.shuffle=false",
            "--data.columns={prompt: question, answer: solution}", "--model.reward=components.reward.FunctionReward",
            "--model.reward.fn=tests.lightning_rl.rewards.raises_on_prompt", "--model.reward.kwargs={bad_prompt: 3+3=}",
            *extra])  # fmt: skip
        monkeypatch.delenv("LIGHTNING_RL_DEBUG", raising=False)
        capsys.readouterr()
        caplog.clear()
        try:
            entry()
            code = 0
        except SystemExit as exit_:
            code = exit_.code
        printed = capsys.readouterr()  # the error line is the last on stderr; Lightning's info lines go to its logger
        said = [record.getMessage() for record in caplog.records]
        return code, [line for line in (*said, *(printed.out + printed.err).splitlines()) if line.strip()]

    code, lines = fit(tmp_path / "stops")
    run, checkpoint = tmp_path / "stops" / "run" / "version_0", tmp_path / "stops" / "checkpoints" / "last.ckpt"
    assert code == 1
    assert not any(line.startswith(("Traceback", '  File "')) for line in lines), lines  # no trace on the console
    assert (
        f"RewardError: saved the last completed iteration (1) to {checkpoint}; resume with --ckpt_path {checkpoint}"
        in lines
    )
    assert f"the whole trace: {run / 'run.log'}" in lines
    assert re.fullmatch(
        r"error: reward FunctionReward\(tests\.lightning_rl\.rewards\.raises_on_prompt\) failed at row 0 of 4 "
        r"\(prompt '3\+3=', completion '.*'\): ValueError: cannot parse '3\+3='; set on_failure: score on this reward "
        r"\(e\.g\. model\.reward\.init_args\.on_failure\) to give such rows its failure_score, counted in "
        r"reward/error_frac, and go on",
        lines[-1],
    ), lines[-1]
    trace = (run / "run.log").read_text()
    assert "Traceback (most recent call last)" in trace and "ValueError: cannot parse '3+3='" in trace

    code, lines = fit(tmp_path / "goes_on", "--model.reward.on_failure=score", "--model.reward.failure_score=-1")
    assert code == 0, lines
    logged = scalars(tmp_path / "goes_on")
    # iteration 2 (logged at step 1) holds the prompt's two rows of four: scored -1 and counted
    assert [v for _, v in logged["reward/error_frac"]] == [0.0, 0.5, 0.0]
    assert logged["reward/min"][1][1] == -1.0
