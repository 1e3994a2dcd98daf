"""``reasoning_gym:<task>``: seeded prompts generated offline, a held-out split never trained on, settings checked."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("reasoning_gym")

from lightning_rl.data.sources import load_rows  # noqa: E402

TASK = "reasoning_gym:basic_arithmetic?min_terms=2&max_terms=2&max_digits=2&operators=+&size=200&test_size=50"


def test_rows_are_seeded_with_a_disjoint_held_out_split():
    train, test = load_rows(TASK, "train").to_list(), load_rows(TASK, "test").to_list()
    assert len(test) == 50 and 0 < len(train) <= 200
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert load_rows(TASK, "train").to_list() == train  # same seed, same rows
    assert load_rows(TASK + "&seed=1", "train").to_list() != train
    record = json.loads(train[0]["reasoning_gym"])
    assert record["task"] == "basic_arithmetic" and record["entry"]["question"] == train[0]["prompt"]
    assert str(record["entry"]["answer"]) == train[0]["answer"]
    a, b = (int(x) for x in train[0]["prompt"].removeprefix("Calculate ").rstrip(".").split(" + "))
    assert int(train[0]["answer"]) == a + b  # the settings reached the task: two terms, +, two digits


@pytest.mark.parametrize(
    "source, split, message",
    [
        ("reasoning_gym:no_such_task", "train", "unknown reasoning-gym task 'no_such_task'"),
        ("reasoning_gym:basic_arithmetic?max_digitz=2", "train", "has no setting 'max_digitz'"),
        ("reasoning_gym:basic_arithmetic", "validation", "has splits 'train' and 'test'"),
    ],
)
def test_mistakes_name_the_source_and_the_fix(source, split, message):
    with pytest.raises(ValueError, match=message):
        load_rows(source, split)


@pytest.mark.parametrize(
    "query, message",
    [
        ("size=-5", "size must be a whole number >= 1, got size=-5"),
        ("size=abc", "size must be a whole number >= 1, got size=abc"),
        ("test_size=0", "test_size must be a whole number >= 1, got test_size=0"),
        ("seed=1.5", "seed must be a whole number, got seed=1.5"),
        ("min_terms=abc", "min_terms must be a whole number, got min_terms=abc"),
        ("allow_parentheses=yes", "allow_parentheses must be true or false, got allow_parentheses=yes"),
        (
            "min_digits=5&max_digits=2",
            "basic_arithmetic rejects min_digits=5, max_digits=2: max_digits must be >= min_digits",
        ),
        ("min_terms=-3", "basic_arithmetic rejects min_terms=-3: min_terms must be positive"),
        ("operators=+&operators=-", "operators is given twice (operators=+ and operators=-); give it once"),
        ("size=3&size=4", "size is given twice (size=3 and size=4); give it once"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_field_and_its_value(query, message):
    source = f"reasoning_gym:basic_arithmetic?{query}"
    with pytest.raises(ValueError) as caught:
        load_rows(source, "test")
    assert str(caught.value) == f"{source!r}: {message}"
