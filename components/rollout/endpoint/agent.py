"""`OpenAIAgent`: episodes of an agent written against an OpenAI client, trained on the exact tokens it was served.

    def agent(client: openai.OpenAI, row: dict) -> result          # or: async def agent(client: openai.AsyncOpenAI, row)

The function is named by dotted path (``function: my_package.my_agent``). Each episode (``group_size`` per prompt)
calls it once with a client pointed at the trainer's loopback endpoint (components.rollout.endpoint.server), carrying
the episode's own URL and API key (good for that episode only), and the prompt's data row; it may call ``client.chat.completions.create`` / ``client.completions.create`` as often as it
likes, run tools, and returns what the reward reads: ``result`` lands in the batch's column ``result`` (and, when it
is text, in ``completions``, which rewards such as ExactMatch judge). Every call is sampled by ``model.rollout``
(HFRollout, SGLangRollout) and recorded with its exact prompt ids, sampled ids and log-probs; a conversation becomes
training rows as components.rollout.endpoint.conversation describes (TITO, prefix breaks).

Rows: an episode is one row, or several when the agent rewrote its history (each break starts a row). Every episode
of a batch is given as many rows as the one with the most (the rest empty, no token trained), so groups stay equal
in size and each episode weighs the same in its group's mean and spread. An episode that raises, passes
``timeout_s`` or never calls the endpoint keeps its rows (or one empty row), has ``result`` None and is scored like
any other (a reward reading ``completions`` sees ""), and is counted in ``agent/error_frac``, ``agent/timeout_frac``
and ``agent/no_call_frac``; a round where any failed prints one line on the console with their count and the first
error. Calls refused by ``max_calls_per_episode`` / ``max_rows_per_episode`` are answered 400 (the agent decides what
to do) and counted in ``agent/call_limit_frac`` / ``agent/row_limit_frac``.

Stopping: an episode's deadline and a cancel end its sampler call in flight (components.rollout.interrupt); a SIGTERM
while a round samples ends the round at once and raises `RoundInterrupted` (a KeyboardInterrupt: Lightning then saves
the last completed iteration and exits, as for Ctrl-C) instead of training on a round that was cut short.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import signal
import sys
import threading
import time
import uuid
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from components.env.tool_calls import ToolCallParser, stop_token_ids
from lightning_rl.core.batch import Prompts, RolloutBatch
from lightning_rl.core.contracts import Agent, Rollout
from lightning_rl.core.errors import ConfigError, import_object
from lightning_rl.core.hf_attributes import model_config
from lightning_rl.core.models import context_length
from lightning_rl.core.sampling_params import SamplingParams

from ..chat_turns import ChatTemplate
from ..episode import Episode, left_pad, response_fields, transcript
from .chat import longest_token_bytes
from .conversation import Conversation
from .outcomes import report_failures, round_metrics
from .rounds import EpisodeRun, Round
from .server import Endpoint, EndpointLimits


class RoundInterrupted(KeyboardInterrupt):
    """The run was stopped (SIGTERM) while a round of episodes sampled: the round ended at once, untrained."""


class OpenAIAgent(Agent):
    """Your agent function, given an OpenAI client on a loopback endpoint the sampler serves, trained on the exact tokens."""

    def __init__(
        self,
        function: str,
        timeout_s: float = 300.0,
        max_total_tokens: int | None = None,
        chat_template: str | None = None,
        tool_calls: ToolCallParser | None = None,
        reasoning_tags: list[str] | None = None,
        model_name: str = "policy",
        batch_wait_s: float = 0.02,
        max_calls_per_episode: int = 256,
        max_rows_per_episode: int = 16,
        limits: EndpointLimits | None = None,
    ):
        """
        Args:
            function: dotted path of ``agent(client, row) -> result`` (sync, given an ``openai.OpenAI``; or async,
                given an ``openai.AsyncOpenAI``).
            timeout_s: an episode still running after this many seconds ends as a failure (its client is shut out).
            max_total_tokens: most response tokens of one training row (the sampled turns and the messages added between
                them); None = the policy's context (max_position_embeddings) less the row's prompt, the most that fits.
            chat_template: a Jinja chat template, or a file holding one, for /v1/chat/completions (None = the tokenizer's).
            tool_calls: how the model writes tool calls (components.rollout.endpoint.HermesToolCalls, JsonToolCalls,
                TagToolCalls; None = no tool calls are parsed).
            reasoning_tags: [open, close] around the model's reasoning (e.g. ["<think>", "</think>"]): answered as
                the message's ``reasoning_content`` (None = part of the content).
            model_name: the model id the endpoint serves (a request naming another is refused).
            batch_wait_s: how long the endpoint waits for one more concurrent call before sampling those it has.
            max_calls_per_episode: calls one episode may make; later ones are answered 400 (``agent/call_limit_frac``).
            max_rows_per_episode: training rows one episode may make (a call that does not continue the conversation as
                served, or runs beside another of the episode, starts one); a call past it is answered 400
                (``agent/row_limit_frac``). Every episode of a batch is padded to as many rows as the one with the most.
            limits: the endpoint's request size, timeouts, connections and requests in flight (None = the defaults of
                components.rollout.endpoint.EndpointLimits).
        """
        if timeout_s <= 0 or (max_total_tokens is not None and max_total_tokens < 1) or batch_wait_s < 0:
            raise ValueError(
                f"OpenAIAgent: need timeout_s > 0, max_total_tokens >= 1 (or null) and batch_wait_s >= 0; got {timeout_s}, {max_total_tokens}, {batch_wait_s}"
            )
        if max_calls_per_episode < 1 or max_rows_per_episode < 1:
            raise ValueError(
                f"OpenAIAgent: max_calls_per_episode and max_rows_per_episode must be >= 1, got {max_calls_per_episode}, {max_rows_per_episode}"
            )
        if reasoning_tags is not None and len(reasoning_tags) != 2:
            raise ValueError(f"OpenAIAgent: reasoning_tags must be [open, close], got {reasoning_tags}")
        self.function_path, self.timeout_s, self.max_total_tokens = function, timeout_s, max_total_tokens
        self.template_source, self.tool_calls = chat_template, tool_calls or ToolCallParser()
        self.reasoning = tuple(reasoning_tags) if reasoning_tags else None
        self.model_name, self.batch_wait_s = model_name, batch_wait_s
        self.max_calls_per_episode, self.max_rows_per_episode = max_calls_per_episode, max_rows_per_episode
        self.limits = limits or EndpointLimits()
        self.tokenizer, self.template, self.endpoint = None, None, None
        require_agent_packages(type(self).__name__)
        self.function = load_function(function)  # a mistyped path fails here, before any model loads
        self.stop_ids: list[int] = []
        self._rounds: set[Round] = set()
        self._warned: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._previous_sigterm = None

    def setup(self, tokenizer, sampler: Rollout) -> None:
        if sampler.params.greedy_baseline:
            raise ConfigError(
                f"model.agent ({type(self).__name__}) cannot run with a greedy baseline row (ReMax): set model.rollout.init_args.greedy_baseline: false"
            )
        if "rollout_logprobs" not in sampler.provides:
            raise ConfigError(
                f"model.agent ({type(self).__name__}) records the sampler's log-prob of every token it serves: use a rollout that "
                "reports them (SGLangRollout, or HFRollout with return_logprobs: true)"
            )
        self.tokenizer = tokenizer
        source = self.template_source
        if source is not None and Path(source).is_file():
            source = Path(source).read_text()
        self.template = ChatTemplate(tokenizer, source) if source or tokenizer.chat_template else None
        end = self.template.end_of_turn_id() if self.template is not None else None
        self.stop_ids = [] if end is None else [end]
        self.end_ids = {tokenizer.eos_token_id, *self.stop_ids}
        self.stop_ids += stop_token_ids(tokenizer, self.tool_calls.stop_texts, "model.agent.init_args.tool_calls")
        self.longest = longest_token_bytes(tokenizer)
        self.endpoint = Endpoint(self.model_name, self.limits)
        self._stop_rounds_on_sigterm()

    # ------------------------------------------------------------------ a round of episodes
    @torch.no_grad()
    def generate(
        self, sampler: Rollout, prompts: Prompts, policy: nn.Module, params: SamplingParams | None = None
    ) -> tuple[RolloutBatch, dict[str, Tensor]]:
        if self.endpoint is None:
            raise RuntimeError(
                "OpenAIAgent.setup(tokenizer, sampler) must run before generate (RLModule.configure_model calls it)"
            )
        params = params or sampler.params
        g, rows = params.samples_per_prompt, prompts.rows()
        data_prompts = [
            ids[mask.bool()].tolist() for ids, mask in zip(prompts.prompt_ids.cpu(), prompts.prompt_mask.cpu())
        ]
        context = context_length(model_config(policy))
        episodes = [
            EpisodeRun(
                uuid.uuid4().hex,
                rows[i // g],
                data_prompts[i // g],
                Conversation(
                    self.template,
                    self.tokenizer,
                    self.max_total_tokens,
                    self.max_rows_per_episode,
                    context,
                    self.longest,
                ),
            )
            for i in range(len(prompts) * g)
        ]
        round_ = Round(self, sampler, policy, params, episodes)
        self._rounds.add(round_)
        was_training = policy.training if policy is not None else False
        try:
            for episode in episodes:
                self.endpoint.open(episode.key, lambda route, request, e=episode: round_.submit(e, route, request))
                episode.deadline = time.monotonic() + self.timeout_s
                episode.future = self._start(episode)
            round_.run()
        finally:
            self._rounds.discard(round_)
            if policy is not None:
                policy.train(was_training)
        if round_.stopped_by is not None:
            message = f"{round_.stopped_by} while {len(episodes)} episodes sampled: the round was ended at once and is not trained"
            print(f"agents: {message}", file=sys.stderr, flush=True)  # Lightning reports it as a KeyboardInterrupt
            raise RoundInterrupted(message)
        report_failures(episodes)
        return self._batch(episodes, prompts, g, sampler.pad_token_id), round_metrics(episodes)

    def _start(self, episode: EpisodeRun) -> Future:
        url, key, row = self.endpoint.base_url(episode.key), self.endpoint.token(episode.key), dict(episode.row)
        if inspect.iscoroutinefunction(self.function):
            return asyncio.run_coroutine_threadsafe(self._run_async(url, key, row), self._event_loop())
        future: Future = Future()

        def run() -> None:
            import openai

            from .http_client import episode_http_client

            http = episode_http_client(asynchronous=False)  # its own pool: see http_client.py
            client = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=self.timeout_s, http_client=http)
            try:
                future.set_result(self.function(client, row)) if future.set_running_or_notify_cancel() else None
            except BaseException as err:  # the agent's failure is the episode's, reported in its metrics
                future.set_exception(err) if not future.done() else None
            finally:
                http.close()

        threading.Thread(target=run, name=f"agent-{episode.key[:8]}", daemon=True).start()  # a hung one is left behind
        return future

    async def _run_async(self, url: str, key: str, row: dict) -> Any:
        import openai

        from .http_client import episode_http_client

        http = episode_http_client(asynchronous=True)
        client = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=self.timeout_s, http_client=http)
        try:
            return await self.function(client, row)
        finally:
            await http.aclose()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="agent-loop", daemon=True).start()
        return self._loop

    # ------------------------------------------------------------------ the batch
    def _batch(self, episodes: list[EpisodeRun], prompts: Prompts, g: int, pad_token_id: int) -> RolloutBatch:
        per_episode = [[row.episode for row in e.conversation.rows] or [Episode(e.prompt, None)] for e in episodes]
        k = max(len(rows) for rows in per_episode)  # rows per episode, the same for all: equal groups
        laid = [rows + [Episode(rows[-1].prompt, None) for _ in range(k - len(rows))] for rows in per_episode]
        flat = [row for rows in laid for row in rows]
        device = prompts.prompt_ids.device
        prompt_ids, prompt_mask = left_pad([row.prompt for row in flat], pad_token_id, device)
        columns = {name: [v for v in values for _ in range(g * k)] for name, values in prompts.columns.items()}
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        columns.update(
            result=[e.result for e in episodes for _ in range(k)],
            completions=[
                (e.result if isinstance(e.result, str) else e.last_text) if e.status == "done" else ""
                for e in episodes
                for _ in range(k)
            ],
            agent_error=[e.error for e in episodes for _ in range(k)],
            transcripts=[transcript(row, decode) for row in flat],
        )
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            columns=columns,
            **response_fields(flat, pad_token_id, device),
            group_ids=torch.arange(len(prompts), device=device).repeat_interleave(g * k),
        )

    # ------------------------------------------------------------------ texts and warnings
    def turn_text(self, ids: list[int]) -> str:
        """A sampled turn as the agent reads it: special tokens kept (a call's tags may be special), the EOS or
        end-of-turn token that closed it dropped."""
        if ids and ids[-1] in self.end_ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def warn_once(self, text: str) -> None:
        if text not in self._warned:
            self._warned.add(text)
            warnings.warn(text)

    def cancel(self) -> None:
        for round_ in list(self._rounds):
            round_.cancelled.set()

    def _stop_rounds_on_sigterm(self) -> None:
        """SIGTERM ends the rounds sampling now (then the handler that was there runs: Lightning's, which ends the
        run at the iteration's end). Lightning installs its handler after setup and keeps this one in its chain."""
        if threading.current_thread() is not threading.main_thread() or self._previous_sigterm is not None:
            return
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum, frame) -> None:
            rounds = list(self._rounds)
            for round_ in rounds:
                round_.stopped_by = "SIGTERM"
                round_.cancelled.set()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL and not rounds:  # no round to end: the default, the process ends
                signal.signal(signum, signal.SIG_DFL)
                signal.raise_signal(signum)

        signal.signal(signal.SIGTERM, on_sigterm)
        self._previous_sigterm = (on_sigterm, previous)

    def close(self) -> None:
        self.cancel()
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
        if self._previous_sigterm is not None:
            installed, previous = self._previous_sigterm
            if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is installed:
                signal.signal(signal.SIGTERM, previous)
            self._previous_sigterm = None
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None


def require_agent_packages(agent: str) -> None:
    """Fail naming the extra to install when a package the endpoint needs is missing."""
    try:
        for module in ("openai", "httpx2", "starlette", "uvicorn"):
            importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"model.agent ({agent}) gives the agent an OpenAI client on an endpoint it serves, which needs "
            f"{err.name}: pip install 'lightning-rl[agents]'"
        ) from None


def load_function(path: str, key: str = "model.agent.init_args.function") -> Callable:
    """The agent function at dotted ``path``; a `ConfigError` naming ``key`` and the closest importable path when there
    is none (at construction, before any model loads)."""
    expects = "the dotted path of agent(client, row), importable from the folder you run in"
    function = import_object(path, key, expects)
    if not callable(function):
        raise ConfigError(f"{key}: {path} is a {type(function).__name__}, not a function; give {expects}")
    return function
