"""JSON data files read as written (lightning_rl.data.json_files): a column that mixes types arrives as the file wrote
it (never "007" -> 7, a number prompt still refused as one), a column of one type keeps it, and a line that is not
UTF-8 is one error naming file and line."""

from __future__ import annotations

import json

import pytest
import torch

from components.reward import ExactMatch
from lightning_rl.data.checks import DataError
from lightning_rl.data.prompts import PromptDataModule
from lightning_rl.data.sources import load_rows
from tests.helpers import batch_from_scores

MIXED = [
    {"prompt": "1+1=", "answer": 2},
    {"prompt": "9/2=", "answer": "4.50"},
    {"prompt": "3+4=", "answer": "007"},
    {"prompt": "1=1?", "answer": "true"},
]


def test_a_mixed_type_answer_column_arrives_as_written_and_right_answers_score_1(tmp_path, tiny_model_path):
    """datasets' Json type decoded "007" to 7, "4.50" to 4.5 and "true" to True: ExactMatch scored these 0."""
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in MIXED))
    assert [row["answer"] for row in load_rows(str(path), "train")] == [2, "4.50", "007", "true"]

    data = PromptDataModule(train_data=str(path), val_data=None, tokenizer=tiny_model_path, batch_size=4, shuffle=False)
    data.setup("fit")
    answers = next(iter(data.train_dataloader()))["prompts"].columns["answer"]
    assert answers == [2, "4.50", "007", "true"]
    completions = ["2", "4.50", "007", "true"]  # each the right answer, as written
    scores = ExactMatch()(batch_from_scores(torch.zeros(4), columns={"completions": completions, "answer": answers}))
    assert scores.tolist() == [1.0, 1.0, 1.0, 1.0]


def test_a_column_of_one_type_keeps_it_and_one_arrow_cannot_hold_arrives_as_written(tmp_path):
    rows = [
        {"prompt": "a", "n": 2, "x": 2.5, "ok": True, "meta": {"k": 1}, "ids": [1, 2], "mixed_list": [1, "a"]},
        {"prompt": "b", "n": 3, "x": 3, "ok": False, "meta": {"k": 2}, "ids": [3], "mixed_list": [2]},
    ]
    path = tmp_path / "typed.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    read = list(load_rows(str(path), "train"))
    assert [r["n"] for r in read] == [2, 3] and [r["ok"] for r in read] == [True, False]
    assert [r["x"] for r in read] == [2.5, 3.0]  # one JSON type: numbers, as floats
    assert [r["meta"] for r in read] == [{"k": 1}, {"k": 2}] and [r["ids"] for r in read] == [[1, 2], [3]]
    assert [r["mixed_list"] for r in read] == [[1, "a"], [2]]  # Arrow holds no list of a number and a string


def test_a_json_list_file_is_read_as_written_too(tmp_path):
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(MIXED))
    rows = load_rows(str(path), "train").rename_columns({"answer": "reference"}).select([3, 2, 1, 0])
    assert [row["reference"] for row in rows] == ["true", "007", "4.50", 2]


@pytest.mark.parametrize(
    "name, content",
    [
        (
            "loads.jsonl",
            b'{"prompt": "a", "answer": "1"}\n{"prompt": "b\xff\xfe", "answer": "2"}\n',
        ),  # then failed at a row
        ("mixed.jsonl", b'{"prompt": "a", "answer": 1}\n{"prompt": "b", "answer": "2\xff"}\n'),  # failed in our check
        ("rows.csv", b"prompt,answer\na,1\nb\xff,2\n"),
    ],
)
def test_a_line_that_is_not_utf8_is_one_error_naming_file_and_line(tmp_path, tiny_model_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    data = PromptDataModule(train_data=str(path), val_data=None, tokenizer=tiny_model_path)
    with pytest.raises(DataError) as bad:
        data.setup("fit")
    message = str(bad.value)
    assert message.startswith(f"{path}, line {3 if name.endswith('.csv') else 2}: byte 0xff at column ")
    assert "is not UTF-8 text. Save the file as UTF-8" in message and "\n" not in message
