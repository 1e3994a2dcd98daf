"""The completions table: one row per prompt (not one prompt's group), with reward, gold answer and advantage."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

from lightning_rl.loop.sample_table import markdown, print_rows, sample_rows
from tests.helpers import batch_from_scores


def _batch():
    # 3 prompts x 2 samples; the first row of each group is the greedy baseline (ReMax layout) for group 1 only
    batch = batch_from_scores([1.0, 0.0, 0.5, 0.25, 0.0, 1.0], lengths=[2, 1, 2, 2, 1, 2], group_size=2)
    advantages = (
        torch.tensor([[0.5, 1.5], [-1.0, 9.0], [0.0, 0.0], [0.3, 0.3], [2.0, 0.0], [-0.5, -0.5]]) * batch.response_mask
    )
    return batch.replace(advantages=advantages, is_greedy=torch.tensor([0, 0, 1, 0, 0, 0]))


META = {
    "prompts": ["1+1=", "1+1=", "2+2=", "2+2=", "3|3", "3|3"],
    "completions": ["2", "3", "4", "5", "6\nx", "6"],
    "answer": ["2", "2", "4", "4", "6", "6"],
}


def test_one_row_per_prompt_with_gold_and_sequence_mean_advantage():
    rows = sample_rows(_batch().replace(columns=META), 5)
    assert rows == [
        {
            "prompt": "1+1=",
            "completion": "2",
            "reward": "1.000",
            "gold": "2",
            "advantage": "+1.000",
        },  # mean of 0.5, 1.5
        {
            "prompt": "2+2=",
            "completion": "5",
            "reward": "0.250",
            "gold": "4",
            "advantage": "+0.300",
        },  # greedy row 2 skipped
        {
            "prompt": "3|3",
            "completion": "6 x",
            "reward": "0.000",
            "gold": "6",
            "advantage": "+2.000",
        },  # padding token excluded
    ]
    assert len(sample_rows(_batch().replace(columns=META), 2)) == 2


def test_without_answers_or_advantages_the_columns_are_left_out():
    meta = {k: v for k, v in META.items() if k != "answer"}
    rows = sample_rows(batch_from_scores([1.0, 0.0], group_size=1).replace(columns=meta), 4)
    assert [list(r) for r in rows] == [["prompt", "completion", "reward"]] * 2


def test_markdown_escapes_pipes_and_console_shows_every_cell():
    rows = sample_rows(_batch().replace(columns=META), 3)
    text = markdown(rows)
    assert text.splitlines()[0] == "| prompt | completion | reward | gold | advantage |" and "| 3\\|3 |" in text
    out = io.StringIO()
    print_rows(rows, "samples at iteration 7", Console(file=out, width=120))
    printed = out.getvalue()
    assert "samples at iteration 7" in printed and all(cell in printed for row in rows for cell in row.values())


def test_a_transcript_shows_its_marked_observations_and_the_advantage_of_the_models_tokens():
    # one agent episode: model tokens 0-1, an observation at 2-3, the model's answer at 4; GRPO's advantage 0.8
    # sits on the model's tokens only, so the row's advantage is 0.8 (not 0.8 * 3/5 diluted by the observation)
    batch = batch_from_scores([1.0], lengths=[5], action_mask=torch.tensor([[1, 1, 0, 0, 1]]))
    batch = batch.replace(advantages=torch.tensor([[0.8, 0.8, 0.0, 0.0, 0.8]]))
    meta = {
        "prompts": ["12*3="],
        "completions": ["36"],
        "transcripts": ["<call>12*3</call>[[env: <result>36</result>]]36"],
    }
    rows = sample_rows(batch.replace(columns=meta), 1)
    assert rows[0]["advantage"] == "+0.800" and rows[0]["completion"] == meta["transcripts"][0]
    out = io.StringIO()
    print_rows(rows, "samples", Console(file=out, width=200))
    assert "<call>12*3</call>[[env: <result>36</result>]]36" in out.getvalue()  # brackets are text, not console markup


@pytest.mark.slow
def test_the_table_shows_the_prompt_as_the_model_read_it(tmp_path, tiny_model_path):
    """A prompt with characters the tokenizer does not know: the table shows its unknown tokens, not the data's text."""
    import json

    from tests.lightning_rl.cli_runs import cli_args, run_cli, texts

    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"add {a}+{a}=", "answer": str(2 * a)}) for a in range(10, 14)))
    run_cli("fit", cli_args(tmp_path, tiny_model_path, 1, f"--data.train_data={data}", "--data.val_data=null"))
    (table,) = [markdown for _, markdown in texts(tmp_path)["samples/text_summary"]]
    assert "| <unk><unk><unk> 1" in table and "add " not in table
