"""The built-in verifiable tasks: integer arithmetic with an exact answer, and counting the shapes in a picture.

``builtin:arithmetic`` gives rows ``{"prompt": "37+45=", "answer": "82"}``; ``builtin:calc`` gives
3-digit x 2-digit products ``{"prompt": "123*45=", "answer": "5535"}``, too hard for a tiny model in
its head but easy with a calculator tool (the agent task, configs/agent_calc.yaml). Each problem space
is shuffled once with a fixed seed and the first ``n_test`` problems are held out, so the ``test``
split never appears in ``train``. ``builtin:count_shapes``, the visual task (configs/vlm_count_shapes.yaml), draws
its pictures on the fly: ``{"prompt": "how many shapes?", "image": <PIL image>, "answer": "3"}``.
"""

from __future__ import annotations

import random
from itertools import product

OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def arithmetic_rows(
    split: str = "train", max_operand: int = 99, operators: str = "+", n_test: int = 500, seed: int = 1234
) -> list[dict]:
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


COUNT_PROMPT = "how many shapes?"


def count_shapes_rows(
    split: str = "train",
    n_train: int = 2000,
    n_test: int = 200,
    size: int = 56,
    max_count: int = 5,
    cell: int = 14,
    seed: int = 1234,
) -> list[dict]:
    """``size`` x ``size`` pictures of 1 to ``max_count`` shapes (squares and discs of 7 to 10 pixels, in bright colours)
    on a dark background, with the count as the answer. Each shape lies inside its own ``cell`` x ``cell`` square of a
    grid (14 pixels: one vision patch of Qwen2-VL), at a random place in it: shapes never touch and never straddle two
    patches, so a tiny vision tower can count them. Every picture is drawn from its own seed (split, index), so
    ``test`` pictures are not ``train`` pictures."""
    from PIL import Image, ImageDraw

    if split not in ("train", "test"):
        raise ValueError(f"builtin:count_shapes has splits 'train' and 'test', not {split!r}")
    per_side = size // cell
    rows = []
    for index in range(n_test if split == "test" else n_train):
        rng = random.Random(f"{seed}-{split}-{index}")
        count = rng.randint(1, max_count)
        image = Image.new("RGB", (size, size), tuple(rng.randint(0, 40) for _ in range(3)))
        draw = ImageDraw.Draw(image)
        for place in rng.sample(range(per_side * per_side), count):
            side = rng.randint(7, 10)
            x = (place % per_side) * cell + rng.randint(1, cell - side - 1)
            y = (place // per_side) * cell + rng.randint(1, cell - side - 1)
            colour = tuple(rng.randint(150, 255) for _ in range(3))
            (draw.rectangle if rng.random() < 0.5 else draw.ellipse)([x, y, x + side - 1, y + side - 1], fill=colour)
        rows.append({"prompt": COUNT_PROMPT, "image": image, "answer": str(count)})
    return rows


BUILTIN_TASKS = {"arithmetic": arithmetic_rows, "calc": calc_rows, "count_shapes": count_shapes_rows}
