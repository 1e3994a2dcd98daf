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


CALLS: dict[str, int] = {}


def digit_count_then_fault(completions, fault_at: int, key: str, fault: str = "error", **_):
    """digit_count, except that call number ``fault_at`` (counted per ``key``) raises, is interrupted or gets a SIGTERM."""
    import os
    import signal

    CALLS[key] = CALLS.get(key, 0) + 1
    if CALLS[key] == fault_at:
        if fault == "error":
            raise ValueError("the reward server went away")
        if fault == "interrupt":
            raise KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM)  # Lightning's handler flags it; the iteration finishes
    return digit_count(completions)


def sleepy_length(completions, prompts=None, delay: float = 0.05, **_):
    """len(completion) / 10 after sleeping ``delay`` seconds per sample (a judge or a sandbox would wait like this)."""
    import time

    time.sleep(delay * len(completions))
    return [len(c) / 10 for c in completions]


def hangs_on_x(completions, **_):
    """Never returns for a completion containing "x" (an infinite loop in generated code); raises on "e"; else 1."""
    import time

    if any("x" in c for c in completions):
        while True:
            time.sleep(0.01)
    if any("e" in c for c in completions):
        raise ValueError("sandbox crashed")
    return [1.0] * len(completions)


SCORED: list[list[float]] = []


def starts_with_digit(completions, **_):
    """1 when the completion starts with a digit: a 0/1 reward a random tiny model sometimes earns. Scores kept in SCORED."""
    scores = [float(text[:1].isdigit()) for text in completions]
    SCORED.append(scores)
    return scores


def always_zero(completions, **_):
    """Every sample scores alike: every group is degenerate and every advantage zero."""
    return [0.0] * len(completions)


def trl_correct(prompts, completions, solution, **kwargs):
    """A TRL-style reward reading the data's ``solution`` column by its own name."""
    return [float(c.strip() == str(s)) for c, s in zip(completions, solution)]


def trl_correct_answer(prompts, completions, answer, **kwargs):
    """The same reward reading the column under the name ``data.columns: {answer: solution}`` gives it."""
    return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]


def raises_on_prompt(prompts, completions, answer, bad_prompt: str, **kwargs):
    """Exact match, except that a batch holding ``bad_prompt`` raises (a parser that chokes on one row of the data)."""
    for prompt in prompts:
        if prompt == bad_prompt:
            raise ValueError(f"cannot parse {prompt!r}")
    return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]
