"""The built-in verifiable tasks: integer arithmetic with an exact answer.

``builtin:arithmetic`` gives rows ``{"prompt": "37+45=", "answer": "82"}``; ``builtin:calc`` gives
3-digit x 2-digit products ``{"prompt": "123*45=", "answer": "5535"}``, too hard for a tiny model in
its head but easy with a calculator tool (the agent task, configs/agent_calc.yaml). Each problem space
is shuffled once with a fixed seed and the first ``n_test`` problems are held out, so the ``test``
split never appears in ``train``.
"""

from __future__ import annotations

import random
from itertools import product

OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def arithmetic_rows(split: str = "train", max_operand: int = 99, operators: str = "+", n_test: int = 500, seed: int = 1234) -> list[dict]:
    """All problems ``a<op>b=`` with 0 <= a, b <= max_operand, deterministically split into train / test."""
    if split not in ("train", "test"):
        raise ValueError(f"builtin:arithmetic has splits 'train' and 'test', not {split!r}")
    unknown = set(operators) - set(OPERATORS)
    if unknown:
        raise ValueError(f"builtin:arithmetic: unknown operator(s) {sorted(unknown)}; choose from {sorted(OPERATORS)}")
    problems = [(a, op, b) for op in operators for a, b in product(range(max_operand + 1), repeat=2)]
    random.Random(seed).shuffle(problems)
    chosen = problems[:n_test] if split == "test" else problems[n_test:]
    return [{"prompt": f"{a}{op}{b}=", "answer": str(OPERATORS[op](a, b))} for a, op, b in chosen]


def _split(problems: list, split: str, n_test: int, seed: int, task: str) -> list:
    if split not in ("train", "test"):
        raise ValueError(f"builtin:{task} has splits 'train' and 'test', not {split!r}")
    random.Random(seed).shuffle(problems)
    return problems[:n_test] if split == "test" else problems[n_test:]


def calc_rows(split: str = "train", n_test: int = 500, seed: int = 1234) -> list[dict]:
    """Every product ``a*b=`` with 100 <= a <= 999 and 10 <= b <= 99, deterministically split into train / test."""
    problems = _split(list(product(range(100, 1000), range(10, 100))), split, n_test, seed, "calc")
    return [{"prompt": f"{a}*{b}=", "answer": str(a * b)} for a, b in problems]


BUILTIN_TASKS = {"arithmetic": arithmetic_rows, "calc": calc_rows}
