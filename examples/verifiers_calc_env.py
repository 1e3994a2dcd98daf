"""A verifiers environment, as it would run under any verifiers trainer: 3-digit x 2-digit products with a calculator
tool (`ToolEnv`) and a Rubric that gives 1 for the exact product. components.rollout.VerifiersAgent trains a policy on
it through the trainer's endpoint, the Rubric's reward as the training reward (components.reward.ResultScore): the
docs/agents.md's verifiers section stacks its config on configs/openai_agent.yaml. ``data.train_data:
verifiers:examples.verifiers_calc_env.load_environment`` reads the environment's own dataset (``?{"seed":1}`` passes
keyword arguments: other problems, for validation).
"""

from __future__ import annotations

import random

import verifiers as vf
from datasets import Dataset


def calc(expression: str) -> str:
    """Multiply two integers written as a*b.

    Args:
        expression: the product, e.g. 123*45.
    """
    try:
        left, right = (int(x) for x in expression.split("*"))
    except ValueError:
        return f"error: not a product of two integers: {expression!r}"
    return str(left * right)


def exact_product(completion, answer, **kwargs) -> float:
    """1 when the last assistant message is the product, else 0."""
    replies = [m for m in completion if m.get("role") == "assistant"]
    return float(bool(replies) and (replies[-1].get("content") or "").strip() == answer)


def load_environment(size: int = 256, seed: int = 0) -> vf.Environment:
    """``size`` problems "a*b=" (a in 100..999, b in 10..99) drawn with ``seed``, a calculator tool and the exact-match Rubric."""
    rng = random.Random(seed)
    pairs = [(rng.randrange(100, 1000), rng.randrange(10, 100)) for _ in range(size)]
    dataset = Dataset.from_list([{"question": f"{a}*{b}=", "answer": str(a * b)} for a, b in pairs])
    return vf.ToolEnv(dataset=dataset, tools=[calc], max_turns=3, rubric=vf.Rubric(funcs=[exact_product]))
