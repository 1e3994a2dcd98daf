"""A two-turn agent for configs/openai_agent.yaml's tiny tool-using policy: the example agent's calculator loop on the
row's problem, then a follow-up question in the same conversation ("Are you sure? Answer again:") answered the same
way. Its rows hold the follow-up's 27 tokens besides two answers: with the preset's former max_total_tokens of 40,
38% of its episodes failed; the preset's limit must fit it."""

from __future__ import annotations

import json

from examples.openai_calc_agent import CALCULATOR, calculate

FOLLOW_UP = "Are you sure? Answer again:"


def two_turn_agent(client, row: dict) -> str:
    """The answer after the follow-up question (the calculator run as the model calls it)."""
    messages = [{"role": "user", "content": row["prompt"]}]
    answer = ""
    for turn in range(2):
        if turn:
            messages.append({"role": "user", "content": FOLLOW_UP})
        for _ in range(3):
            reply = client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR], max_tokens=10)
            message = reply.choices[0].message
            messages.append(message)
            if not message.tool_calls:
                answer = message.content or ""
                break
            for call in message.tool_calls:
                expression = json.loads(call.function.arguments).get("expression", "")
                messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(expression)})
    return answer
