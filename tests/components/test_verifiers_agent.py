"""VerifiersAgent: verifiers environments (SingleTurnEnv, ToolEnv, MultiTurnEnv) built here on local data run unchanged
through the trainer's endpoint; their Rubric's reward is the training reward (ResultScore); the rows are the exact
sampled ids, the environment's messages masked."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verifiers")

from components.reward import ResultScore  # noqa: E402
from components.rollout.endpoint import HermesToolCalls, VerifiersAgent  # noqa: E402
from lightning_rl.data.sources import load_rows  # noqa: E402
from tests.fixtures.chat_templates import family_tokenizer  # noqa: E402
from tests.helpers import prompts  # noqa: E402
from tests.support.openai import ScriptedChat  # noqa: E402

pytestmark = pytest.mark.server  # the agents' endpoint listens on a port

ROWS = [{"question": "What is 1+2?", "answer": "3"}, {"question": "What is 2+2?", "answer": "4"}]


def _dataset():
    from datasets import Dataset

    return Dataset.from_list(ROWS)


def _exact(completion, answer, **kwargs) -> float:
    return float(completion[-1]["content"].strip() == answer)


def calc(expression: str) -> str:
    """Evaluate a sum such as 1+2.

    Args:
        expression: the sum.
    """
    return str(sum(int(x) for x in expression.split("+")))


def single_turn_env():
    import verifiers as vf

    return vf.SingleTurnEnv(dataset=_dataset(), system_prompt="Answer with a number.", rubric=vf.Rubric(funcs=[_exact]))


def tool_env():
    import verifiers as vf

    return vf.ToolEnv(dataset=_dataset(), tools=[calc], max_turns=4, rubric=vf.Rubric(funcs=[_exact]))


def multi_turn_env():
    import verifiers as vf

    class AskTwice(vf.MultiTurnEnv):
        """Says "Check it." after the first answer; two assistant turns."""

        async def env_response(self, messages, state, **kwargs):
            return [{"role": "user", "content": "Check it."}]

    return AskTwice(dataset=_dataset(), max_turns=2, rubric=vf.Rubric(funcs=[_exact]))


def _run(environment: str, tokenizer, sampler, rows):
    # no policy here: no context to derive max_total_tokens from
    agent = VerifiersAgent(
        f"{__name__}.{environment}", tool_calls=HermesToolCalls(), timeout_s=60, max_total_tokens=1024
    )
    sampler.setup(tokenizer)
    agent.setup(tokenizer, sampler)
    ids = [tokenizer.encode(r["prompt"], add_special_tokens=False) for r in rows]
    try:
        return agent.generate(sampler, prompts(ids, None, rows), None)
    finally:
        agent.close()


@pytest.mark.parametrize(
    "environment, calls, tool_calls", [("single_turn_env", 1, 0), ("tool_env", 3, 2), ("multi_turn_env", 2, 0)]
)
def test_a_verifiers_environment_runs_through_the_endpoint_and_its_rubric_is_the_reward(environment, calls, tool_calls):
    tokenizer = family_tokenizer("chatml")
    sampler = ScriptedChat(tokenizer, "chatml", group_size=2)
    if environment != "tool_env":  # answer "3" at once; in the ToolEnv, call calc twice, then answer "3"
        sampler.family = "answer"
    rows = load_rows(f"verifiers:{__name__}.{environment}", "train").to_list()
    batch, metrics = _run(environment, tokenizer, sampler, rows)
    assert float(metrics["agent/error_frac"]) == 0 and float(metrics["agent/turns_mean"]) == calls
    assert float(metrics["agent/tool_calls_mean"]) == tool_calls and float(metrics["agent/prefix_breaks"]) == 0
    scores = ResultScore("reward")(batch)
    assert scores.tolist() == [1.0, 1.0, 0.0, 0.0]  # the model answers "3": right for 1+2, wrong for 2+2
    assert batch.columns["completions"][0] == "3"
    # one row per episode: the environment's messages (tool results, "Check it.") between the sampled turns, masked
    added = (batch.response_mask * (1 - batch.action_mask)).sum(-1)
    assert (added > 0).all() if calls > 1 else (added == 0).all()
    assert torch.allclose(batch.rollout_logprobs[batch.action_mask.bool()], torch.tensor(-0.1))


def test_any_data_row_feeds_the_environment_with_its_system_prompt():
    tokenizer = family_tokenizer("chatml")
    sampler = ScriptedChat(tokenizer, "answer", group_size=1)
    batch, _ = _run("single_turn_env", tokenizer, sampler, [{"prompt": "What is 1+2?", "answer": "3"}])
    assert ResultScore("reward")(batch).tolist() == [1.0]
    prompt = tokenizer.decode(batch.prompt_ids[0][batch.prompt_mask[0].bool()].tolist())
    assert "Answer with a number." in prompt and "What is 1+2?" in prompt


def test_building_an_environment_keeps_the_trainers_signal_handlers():
    """verifiers installs SIGINT / SIGTERM handlers that exit at once; Lightning's (finish the iteration, save
    last.ckpt on SIGTERM) must survive it (a later SIGTERM test saved the wrong step before)."""
    import signal

    from components.rollout.endpoint.verifiers_env import load_environment

    def mine(signum, frame):
        raise AssertionError("not called here")

    previous = {sig: signal.signal(sig, mine) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        load_environment(f"{__name__}.single_turn_env")
        assert signal.getsignal(signal.SIGTERM) is mine and signal.getsignal(signal.SIGINT) is mine
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
