"""Reward functions used by the end-to-end tests (importable by dotted path)."""


def digit_count(completions, **_):
    """Fraction of characters that are digits: a dense signal even a random tiny model can climb."""
    return [sum(c.isdigit() for c in text) / max(1, len(text)) for text in completions]


def always_fails(completions, **_):
    raise ValueError("the answer key is corrupt")


def returns_nan(completions, **_):
    return [float("nan")] + [0.0] * (len(completions) - 1)


def returns_none(completions, **_):
    return [None] * len(completions)


def wrong_length(completions, **_):
    return [1.0]
