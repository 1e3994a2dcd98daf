"""JSON from outside the trainer: nesting measured without recursion (against a recursive measure of the parsed value
on random texts), refused past the bound before it is parsed, and numbers no float holds refused."""

from __future__ import annotations

import json
import random

import pytest

from lightning_rl.core.untrusted_json import MAX_DEPTH, loads, nests_deeper_than


def depth_of(value) -> int:
    """Levels of arrays and objects, by recursion (fine for the shallow values here)."""
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    return 0


def random_value(rng: random.Random, depth: int):
    """A value nested exactly ``depth`` deep, with strings holding brackets, quotes and backslashes."""
    if depth == 0:
        return rng.choice([1, -2.5, None, True, 'a"[{', "\\]}", "{[" * rng.randint(0, 80), '\\\\"['])
    inner = [random_value(rng, rng.randint(0, depth - 1)) for _ in range(rng.randint(0, 3))]
    inner.insert(rng.randint(0, len(inner)), random_value(rng, depth - 1))
    if rng.random() < 0.5:
        return inner
    return {f"k{i}[": v for i, v in enumerate(inner)}


def test_the_measure_agrees_with_a_recursive_one_on_random_texts():
    rng = random.Random(0)
    for _ in range(300):
        value = random_value(rng, rng.randint(0, 12))
        text, depth = json.dumps(value), depth_of(value)
        for bound in (depth - 1, depth, depth + 1):
            if bound >= 0:
                assert nests_deeper_than(text, bound) == (depth > bound), (text, bound)


@pytest.mark.parametrize("depth", [1, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 1_000, 100_000])
def test_a_text_past_max_depth_is_refused_before_it_is_parsed(depth):
    text = "[" * depth + "]" * depth
    if depth <= MAX_DEPTH:
        assert depth_of(loads(text)) == depth
    else:  # json.loads raised RecursionError at 1,000 (and under a raised limit, overflowed the stack at 100,000)
        with pytest.raises(ValueError, match=f"more than {MAX_DEPTH} deep"):
            loads(text)


def test_brackets_in_strings_do_not_count_and_unclosed_ones_do():
    assert loads(json.dumps({"code": "[" * 10_000, "q": '\\"{' * 100})) == {"code": "[" * 10_000, "q": '\\"{' * 100}
    for unclosed in ("[" * 100_000, '{"a": ' * 50_000, '["' + "[" * 100 + '"' + "[" * 100):
        with pytest.raises(ValueError):  # a parser recursed into every open one before it found the end
            loads(unclosed)
    assert nests_deeper_than('"' + '\\"[' * 100, 64) is False  # an unterminated string: its brackets are inside it


@pytest.mark.parametrize("number", ["1e999", "-1e999", "NaN", "Infinity", "-Infinity"])
def test_a_number_no_float_holds_is_refused(number):
    with pytest.raises(ValueError, match=number.lstrip("-")):
        loads(f'{{"n": {number}}}')
    assert loads('{"n": 1e308, "m": 1e-999}') == {"n": 1e308, "m": 0.0}


def test_bytes_are_decoded_as_json_decodes_them():
    assert loads('{"a": [1]}'.encode("utf-16")) == {"a": [1]}
    with pytest.raises(ValueError):
        loads(b'{"a": "\xff"}')
