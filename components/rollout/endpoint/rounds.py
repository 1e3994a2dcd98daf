"""`Round`: one ``generate`` call of an `OpenAIAgent`: the agent function run once per episode, its calls to the
endpoint batched onto the sampler, each episode ended by its return, its exception, its deadline or a cancel.

The driver (the thread that called ``generate``: the trainer's, or the one sampling a round ahead) owns the sampler
and every episode's record; the endpoint's event loop only queues calls and awaits their futures. Calls that arrive
together are sampled together: the driver takes the first call, then waits up to ``batch_wait_s`` for each further
one until every running episode has a call in (an agent between calls, e.g. running a tool, is not waited for
longer). An episode that passes its deadline or is cancelled is ended at once: its calls are answered with an error,
its client is shut out, its function (a thread that cannot be stopped, or a task that is cancelled) is left behind,
and a sampler call in flight for it ends within a decoding step (components.rollout.interrupt), so neither a hang,
an exception nor a stop waits for a whole sampler call.

Before a call reaches the sampler it is checked, so that no request can break the run: its parameters (parameters.py),
its token ids against the vocabulary, its prompt against the policy's context (``max_position_embeddings``), the
episode's calls against ``max_calls_per_episode`` and its rows against ``max_rows_per_episode``; each refusal is a
400 naming the limit, and any other failure to prepare a call is a 500 for that call (and one warning), not the
round's end. The model's own turn is read by the tool-call parser, which takes a malformed or too deeply nested call
as text.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from jinja2 import TemplateError

from lightning_rl.core.batch import Prompts
from lightning_rl.core.hf_attributes import model_config
from lightning_rl.core.models import context_length

from ..episode import left_pad, token_versions
from ..interrupt import SamplingInterrupted, interruptible
from .conversation import ContextFull, Conversation, RowLimit
from .parameters import BadRequest, call_limits
from .replies import chat_answer, chat_message, completion_answer
from .wire import answered, error


@dataclass
class EpisodeRun:
    """One run of the agent function on one data row."""

    key: str
    row: dict
    prompt: list[int]  # the data's prompt ids: the row of an episode that never called
    conversation: Conversation
    deadline: float = 0.0
    future: Future | None = None
    status: str = "running"  # running, done, error, timeout, cancelled
    error: str = ""
    result: Any = None
    last_text: str = ""
    tool_calls: int = 0
    submitted: int = 0  # calls the endpoint took for it
    limits_hit: set = field(default_factory=set)  # "calls", "rows"


@dataclass
class Call:
    episode: EpisodeRun
    route: str
    request: dict
    answer: Future = field(default_factory=Future)


class Round:
    def __init__(self, agent, sampler, policy, params, episodes: list[EpisodeRun]):
        self.agent, self.sampler, self.policy, self.params, self.episodes = agent, sampler, policy, params, episodes
        self.calls: queue.Queue[Call] = queue.Queue()
        self.cancelled = threading.Event()
        self.stopped_by: str | None = None  # the signal that stopped the run (SIGTERM), if one did
        self.context = context_length(model_config(policy))
        self._closing = threading.Lock()  # a call is queued before the final drain, or refused
        self._closed = False

    def submit(self, episode: EpisodeRun, route: str, request: dict) -> Future:
        """On the endpoint's event loop: queue the call; the future is the driver's answer (or a refusal now)."""
        call = Call(episode, route, request)
        with self._closing:
            if self._closed or episode.status != "running":
                return answered(
                    *error(
                        404,
                        f"this episode has ended ({episode.status}); its client cannot sample any more",
                        "episode_ended",
                    )
                )
            if episode.submitted >= self.agent.max_calls_per_episode:
                episode.limits_hit.add("calls")
                message = (
                    f"this episode has made {episode.submitted} calls, and model.agent.init_args.max_calls_per_episode "
                    f"is {self.agent.max_calls_per_episode}"
                )
                return answered(*error(400, message, "episode_call_limit"))
            episode.submitted += 1
            self.calls.put(call)
        return call.answer  # always answered: by the driver, or by `run`'s final drain

    def run(self) -> None:
        try:
            while self._check():
                self._serve(self._gather())
        finally:
            for episode in self.episodes:
                self.agent.endpoint.close_episode(episode.key)
            with self._closing:
                self._closed = True
            while not self.calls.empty():
                self._refuse(self.calls.get_nowait())

    def _gather(self) -> list[Call]:
        try:
            calls = [self.calls.get(timeout=0.05)]
        except queue.Empty:
            return []
        running = sum(e.status == "running" for e in self.episodes)
        while len(calls) < running:
            try:
                calls.append(self.calls.get(timeout=self.agent.batch_wait_s))
            except queue.Empty:
                break
        return calls

    def _check(self) -> bool:
        """End the episodes that returned, raised, passed their deadline or were cancelled; True while any runs."""
        now = time.monotonic()
        for episode in self.episodes:
            if episode.status != "running":
                continue
            late = self.cancelled.is_set() or now > episode.deadline
            failure = None
            if episode.future.done() and not episode.future.cancelled():
                failure = episode.future.exception()
            # an agent that raised after its deadline most likely raised because of it (its sampler call was cut
            # short when the round's last deadline passed): a timeout, not an error of the agent's own
            if episode.future.done() and not (failure is not None and late):
                episode.status, episode.error = (
                    ("error", f"{type(failure).__name__}: {failure}") if failure is not None else ("done", "")
                )
                episode.result = None if failure is not None else episode.future.result()
            elif late:
                episode.status = "cancelled" if self.cancelled.is_set() else "timeout"
                episode.error = (
                    "the run stopped" if self.cancelled.is_set() else f"no result within {self.agent.timeout_s} s"
                )
                episode.future.cancel()  # a task is cancelled; a thread is left to finish on its own, shut out
            if episode.status != "running":
                self.agent.endpoint.close_episode(episode.key)
        return any(e.status == "running" for e in self.episodes)

    def _refuse(self, call: Call) -> None:
        call.answer.set_result(
            error(
                404,
                f"this episode has ended ({call.episode.status}); its client cannot sample any more",
                "episode_ended",
            )
        )

    def _serve(self, calls: list[Call]) -> None:
        ready: dict[tuple, list] = {}
        for call in calls:
            if call.episode.status != "running":
                self._refuse(call)
                continue
            try:
                pending, limits = self._prepare(call)
            except ContextFull as err:
                call.answer.set_result(error(400, str(err), "context_length_exceeded"))
                continue
            except RowLimit as err:
                call.episode.limits_hit.add("rows")
                call.answer.set_result(error(400, str(err), "episode_row_limit"))
                continue
            except (BadRequest, ValueError, KeyError, TypeError, TemplateError) as err:
                call.answer.set_result(error(400, f"{type(err).__name__}: {err}"))
                continue
            except Exception as err:  # a request nothing above foresaw (a chat template's own error): its call fails,
                # never the round (an OverflowError from "n": 1e999 ended a run in its first iteration)
                self.agent.warn_once(f"the agents' endpoint could not prepare a call: {type(err).__name__}: {err}")
                call.answer.set_result(
                    error(500, f"the endpoint could not prepare this call: {type(err).__name__}: {err}")
                )
                continue
            conversation = call.episode.conversation
            room = conversation.room(pending)
            if self.context is not None:
                if len(pending.context) >= self.context:
                    conversation.release(pending)
                    message = (
                        f"the prompt is {len(pending.context)} tokens, and the policy's context "
                        f"(max_position_embeddings) is {self.context}: no room to sample a token"
                    )
                    call.answer.set_result(error(400, message, "context_length_exceeded"))
                    continue
                room = min(room, self.context - len(pending.context))
            new_tokens = min(self.params.max_new_tokens, room, limits.max_tokens or room)
            ready.setdefault((new_tokens, limits.stop_token_ids), []).append((call, pending, limits))
        for (new_tokens, stops), group in ready.items():
            self._sample(group, new_tokens, stops)

    def _prepare(self, call: Call):
        conversation, request, agent = call.episode.conversation, call.request, self.agent
        limits = call_limits(request, call.route, agent.model_name, agent.tokenizer, agent.warn_once)
        if call.route == "chat.completions":
            if not isinstance(request.get("messages"), list):
                raise BadRequest("messages must be a list of chat messages")
            return conversation.chat(request["messages"], request.get("tools")), limits
        prompt = request.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one prompt
        if isinstance(prompt, list):
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
                raise BadRequest("prompt must be one text or one list of token ids")
            vocab = len(agent.tokenizer)
            outside = [t for t in prompt if not 0 <= t < vocab]
            if outside:
                raise BadRequest(f"prompt token ids outside the vocabulary [0, {vocab}): {outside[:5]}")
        elif not isinstance(prompt, str):
            raise BadRequest("prompt must be one text or one list of token ids")
        return conversation.text(prompt), limits

    def _sample(self, group: list, new_tokens: int, stops: tuple[int, ...]) -> None:
        agent, device = self.agent, self.policy_device()
        ids, mask = left_pad([pending.context for _, pending, _ in group], self.sampler.pad_token_id, device)
        stop_ids = tuple(dict.fromkeys([*self.params.stop_token_ids, *agent.stop_ids, *stops]))
        params = replace(self.params, group_size=1, max_new_tokens=new_tokens, stop_token_ids=stop_ids)
        latest = max(call.episode.deadline for call, _, _ in group)  # the call serves none once all have passed
        try:
            with interruptible(lambda: self.cancelled.is_set() or time.monotonic() > latest):
                turn = self.sampler.generate(Prompts(ids, mask), self.policy, params)
        except SamplingInterrupted:
            self._check()  # ends the episodes past their deadline, or all when cancelled
            for call, pending, _ in group:
                call.episode.conversation.release(pending)
                self._refuse(call)
            return
        except BaseException as err:  # the sampler failed (a dead server): the calls learn why, then the run does
            for call, pending, _ in group:
                call.episode.conversation.release(pending)
                call.answer.set_result(error(500, f"the sampler failed: {type(err).__name__}: {err}"))
            raise
        lengths, versions = turn.response_mask.sum(-1).tolist(), token_versions(turn).tolist()
        for row, (call, pending, limits) in enumerate(group):
            sampled = turn.response_ids[row, : lengths[row]].tolist()
            logprobs = turn.rollout_logprobs[row, : lengths[row]].tolist()
            finish = "length" if bool(turn.truncated[row]) else "stop"
            text = agent.turn_text(sampled)
            if call.route == "chat.completions":
                reply = chat_message(text, agent.tool_calls, agent.reasoning)
                call.episode.tool_calls += len(reply.get("tool_calls") or [])
                call.episode.last_text = reply.get("content") or ""
                answer = chat_answer(
                    agent.model_name, reply, finish, pending.context, sampled, logprobs, agent.tokenizer, limits
                )
            else:
                reply = call.episode.last_text = text
                answer = completion_answer(
                    agent.model_name, text, finish, pending.context, sampled, logprobs, agent.tokenizer, limits
                )
            call.episode.conversation.commit(
                pending, sampled, logprobs, versions[row][: lengths[row]], reply, finish == "length"
            )
            call.answer.set_result((200, answer))

    def policy_device(self):
        return next(self.policy.parameters()).device if self.policy is not None else "cpu"
