"""`VerifiersAgent`: a `verifiers` environment (SingleTurnEnv, ToolEnv, MultiTurnEnv, ...) as the episode source, its
Rubric as the reward, run unchanged through the trainer's endpoint.

Each episode runs ``env.run_rollout(input, client, ...)`` with a verifiers OpenAI chat client wrapping the episode's
``AsyncOpenAI`` client, so every model call of the environment is served by ``model.rollout`` and recorded as
OpenAIAgent records any agent's (TITO rows, log-probs); the Rubric scores the rollout as it would anywhere else. The
episode's result is ``{"reward": the rubric's reward, "metrics": its metrics, "answer": the last assistant text}``:
``components.reward.ResultScore`` (``key: reward``) makes the rubric the training reward.

The input of an episode: the data row's ``verifiers_input`` (written by the data source ``verifiers:<module.fn>``,
the environment's own dataset), or else the row's ``prompt`` as the user turn after the environment's system prompt
and few-shot turns, with its ``answer`` and ``info`` columns (any data source then feeds the environment).
"""

from __future__ import annotations

import json
import signal
from typing import Any

from components.env.tool_calls import ToolCallParser
from lightning_rl.core.errors import ConfigError, import_object
from lightning_rl.core.sources import row_source

from .agent import OpenAIAgent
from .server import EndpointLimits

ENVIRONMENT_EXPECTED = (
    "the dotted path of a function that returns a verifiers Environment (e.g. my_env.load_environment)"
)


def load_environment(path: str, env_args: dict | None = None, key: str = "model.agent.init_args.environment"):
    """The environment built by the function (or the object) at dotted ``path``, called with ``env_args``; ``key``
    names the setting in errors."""
    target = import_object(path, key, ENVIRONMENT_EXPECTED)
    # a verifiers Environment replaces the process's SIGINT / SIGTERM handlers with ones that exit at once: the
    # trainer's (Lightning finishes the iteration and saves last.ckpt on SIGTERM) are put back
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        env = target(**(env_args or {})) if callable(target) and not hasattr(target, "run_rollout") else target
    finally:
        for sig, handler in handlers.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)
    if not hasattr(env, "run_rollout"):
        raise ConfigError(
            f"{key}: {path} gave a {type(env).__name__}, not a verifiers Environment; give {ENVIRONMENT_EXPECTED}"
        )
    return env


class VerifiersAgent(OpenAIAgent):
    """A verifiers environment's rollouts through the endpoint; its Rubric's reward in the result (components.reward.ResultScore)."""

    def __init__(
        self,
        environment: str,
        env_args: dict[str, Any] | None = None,
        timeout_s: float = 300.0,
        max_total_tokens: int | None = None,
        chat_template: str | None = None,
        tool_calls: ToolCallParser | None = None,
        reasoning_tags: list[str] | None = None,
        batch_wait_s: float = 0.02,
        max_calls_per_episode: int = 256,
        max_rows_per_episode: int = 16,
        limits: EndpointLimits | None = None,
    ):
        """
        Args:
            environment: dotted path of a function returning the verifiers Environment (e.g. ``my_env.load_environment``).
            env_args: keyword arguments of that function.
            timeout_s: see OpenAIAgent.
            max_total_tokens: see OpenAIAgent.
            chat_template: see OpenAIAgent.
            tool_calls: how the model writes tool calls (ToolEnv needs them: e.g. components.rollout.endpoint.HermesToolCalls).
            reasoning_tags: see OpenAIAgent.
            batch_wait_s: see OpenAIAgent.
            max_calls_per_episode: see OpenAIAgent.
            max_rows_per_episode: see OpenAIAgent.
            limits: see OpenAIAgent.
        """
        super().__init__(
            f"{__name__}.run_episode",
            timeout_s,
            max_total_tokens,
            chat_template,
            tool_calls,
            reasoning_tags,
            "policy",
            batch_wait_s,
            max_calls_per_episode,
            max_rows_per_episode,
            limits,
        )
        self.environment, self.env_args, self.env = environment, dict(env_args or {}), None
        try:
            import verifiers  # noqa: F401
        except ImportError:
            raise ImportError(
                "model.agent (VerifiersAgent) runs verifiers environments: pip install 'lightning-rl[agents]'"
            ) from None
        # a mistyped path fails here, before any model loads; the environment is built at setup
        import_object(environment, "model.agent.init_args.environment", ENVIRONMENT_EXPECTED)

    def setup(self, tokenizer, sampler) -> None:
        if self.template_source is None and not tokenizer.chat_template:
            # every model call of a verifiers environment is a chat completion: without a template each would be refused
            raise ConfigError(
                f"model.agent (VerifiersAgent): the tokenizer of model.policy.path ({tokenizer.name_or_path}) has no chat "
                "template, and a verifiers environment calls the model only through /v1/chat/completions: set "
                "model.agent.init_args.chat_template (a Jinja template, or a file holding one), or use a chat model"
            )
        super().setup(tokenizer, sampler)
        self.env = load_environment(self.environment, self.env_args)
        env = self.env

        async def episode(client, row: dict) -> dict:
            return await run_episode(env, client, row)

        self.function = episode


async def run_episode(env, client, row: dict) -> dict:
    """One rollout of ``env`` on ``row`` through ``client`` (an ``openai.AsyncOpenAI``), scored by its Rubric."""
    from verifiers.clients import OpenAIChatCompletionsClient

    output = await env.run_rollout(episode_input(env, row), OpenAIChatCompletionsClient(client), "policy", {})
    error = output.get("error")
    if error:
        raise RuntimeError(f"the verifiers rollout failed: {error}")
    completion = output.get("completion") or []
    texts = (
        [m.get("content") for m in completion if isinstance(m, dict) and m.get("role") == "assistant"]
        if isinstance(completion, list)
        else [completion]
    )
    return {
        "reward": float(output.get("reward") or 0.0),
        "metrics": output.get("metrics") or {},
        "answer": (texts[-1] if texts else "") or "",
    }


def episode_input(env, row: dict) -> dict:
    """The environment's RolloutInput for a data row."""
    if row.get("verifiers_input"):
        return json.loads(row["verifiers_input"])
    messages = [{"role": "system", "content": env.system_prompt}] if env.system_prompt else []
    messages += list(env.few_shot or []) + [{"role": "user", "content": row["prompt"]}]
    info = row.get("info") or {}
    # no "task" key: verifiers 0.2 reads a string there as a retired routing field and refuses the input
    return {
        "prompt": messages,
        "answer": str(row.get("answer", "")),
        "info": json.loads(info) if isinstance(info, str) else info,
        "example_id": int(row.get("example_id", 0)),
    }


@row_source("verifiers")  # the data source this component brings
def verifiers_rows(source: str, split: str) -> list[dict]:
    """``verifiers:<module.fn>[?json env_args]``: the environment's dataset (train) or eval dataset (test) as rows
    with the prompt's last user text (what the samples table shows), the answer and the whole input."""
    path, _, args = source[len("verifiers:") :].partition("?")
    env = load_environment(path, json.loads(args) if args else None, f"data source {source}")
    dataset = (
        env.get_dataset()
        if split == "train"
        else (env.get_eval_dataset() if env.eval_dataset_source is not None else env.get_dataset())
    )
    rows = []
    for example in dataset:
        keep = {k: example[k] for k in ("prompt", "answer", "info", "task", "example_id") if k in example}
        user = [m["content"] for m in keep["prompt"] if m.get("role") == "user"]
        rows.append(
            {
                "prompt": user[-1] if user else "",
                "answer": str(keep.get("answer", "")),
                "verifiers_input": json.dumps(keep, default=str),
            }
        )
    return rows
