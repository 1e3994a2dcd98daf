"""An agent written with the `openai` package, as it would run against any OpenAI-compatible server: it asks the
model, runs the calculator the model calls, sends the result back, and returns the model's final answer.

Trained by configs/openai_agent.yaml (the trainer hands it a client pointed at its own loopback endpoint):

    lightning-rl fit --config configs/openai_agent.yaml
"""

from __future__ import annotations

import ast
import json
import operator

from openai import OpenAI

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression with + - * and integers.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculate(expression: str) -> str:
    """``expression``'s value, or an error the model can read (nothing is evaluated as Python)."""

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"not an integer expression: {expression!r}")

    try:
        return str(value(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError) as err:
        return f"error: {err}"


def agent(client: OpenAI, row: dict, max_turns: int = 3) -> str:
    """Solve ``row["prompt"]`` (e.g. "123*45="), calling the calculator as the model asks; the final answer's text."""
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(max_turns):
        response = client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR], max_tokens=10)
        message = response.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": calculate(arguments.get("expression", ""))}
            )
    return ""
