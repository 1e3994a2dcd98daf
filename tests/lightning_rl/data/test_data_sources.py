"""Data sources registered by prefix (lightning_rl.core.sources): the data layer's own, a component's, a test's."""

from __future__ import annotations

import pytest

from lightning_rl.core.sources import find_source, registered_prefixes, row_source
from lightning_rl.data.sources import builtin_rows, load_rows


@row_source("squares_for_test")
def squares(source: str, split: str) -> list[dict]:
    n = int(source.split(":", 1)[1])
    return [{"prompt": f"{i}*{i}=", "answer": str(i * i)} for i in range(n if split == "train" else 1)]


def test_a_registered_source_feeds_load_rows():
    rows = load_rows("squares_for_test:3", "train").to_list()
    assert rows == [
        {"prompt": "0*0=", "answer": "0"},
        {"prompt": "1*1=", "answer": "1"},
        {"prompt": "2*2=", "answer": "4"},
    ]
    assert load_rows("squares_for_test:3", "test").num_rows == 1


def test_the_data_layer_registers_its_own_and_a_component_its_own():
    assert find_source("builtin:arithmetic") is builtin_rows
    assert {"builtin", "reasoning_gym"} <= set(registered_prefixes())
    from components.rollout.endpoint.verifiers_env import verifiers_rows  # importing the component registers it

    assert find_source("verifiers:my_env.load_environment") is verifiers_rows


def test_an_unregistered_prefix_names_the_registered_ones():
    with pytest.raises(
        ValueError, match=r"no source is registered for 'nosuch:'; registered: .*builtin:.*reasoning_gym:"
    ):
        load_rows("nosuch:thing", "train")


@pytest.mark.parametrize("source", ["data/train.jsonl", "C:/data/train.jsonl", "hf://datasets/x", "openai/gsm8k"])
def test_paths_urls_and_hub_ids_are_not_prefixes(source):
    assert find_source(source) is None


def test_a_prefix_taken_by_another_function_is_refused():
    with pytest.raises(ValueError, match="'builtin' is registered twice"):
        row_source("builtin")(squares)
