"""The tiny models' character tokenizer, padded to a full-sized vocabulary (benchmarks' random Qwen2)."""

from __future__ import annotations

from lightning_rl.recipes.tiny import build_char_tokenizer, filler_tokens


def test_filler_tokens_are_distinct_and_hold_no_task_character():
    names = filler_tokens(800)
    assert len(set(names)) == 800 and names[:3] == ["~a", "~b", "~c"] and names[26] == "~ba"
    assert not any(c.isdigit() or c in "+-*= " for name in names for c in name)


def test_a_padded_vocabulary_encodes_the_task_as_before_and_decodes_every_id():
    plain, padded = build_char_tokenizer(), build_char_tokenizer(vocab_size=1000)
    assert len(padded) == 1000
    text = "12+34=46"
    assert padded(text)["input_ids"] == plain(text)["input_ids"]
    assert padded.decode(plain(text)["input_ids"]) == text
    assert all(padded.decode([i]) for i in range(len(plain), 1000))  # a random policy's samples all decode
