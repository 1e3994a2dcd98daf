"""`MultiTurnRollout`: episodes of several model turns and environment observations, on any token-in/token-out sampler.

    turn 1    the sampler's ``generate`` on the prompts (``group_size`` samples each), stopping at EOS or
              at the environment's stop token (a tool call's closing tag)
    env       ``env.step(state, turn)`` -> observation, reward, done
    turn k    the observation's tokens are appended and the sampler continues every open episode from its
              whole context (one sample per context; SGLang's prefix cache reuses what it has seen)

until the environment says ``done``, ``max_turns`` turns were taken, or the transcript would pass
``max_total_tokens`` (None: the policy's context less the prompt; then it is cut and flagged ``truncated``). Each row of the batch is one whole
transcript: ``response_ids`` holds the model's turns and the observations as they were sampled and
appended (previous turns are never re-tokenised, so the trainer scores exactly the sampled ids),
``action_mask`` marks the model's tokens and ``env_rewards`` the environment's per-turn rewards
(each episode's bookkeeping and the batch built from them: components.rollout.episode).

The environment's steps of one turn (its tool calls) run concurrently across the open episodes, at most
``max_concurrent_tools`` at a time (a thread pool; each call still bounded by its tool's ``timeout_s``, each
result appended to its own episode): 128 episodes whose tool waits 0.5 s take ~0.5 s x 128 / max_concurrent_tools,
not 64 s (benchmarks/agent_rounds.py). An environment's ``step`` is therefore called from several threads at once,
for different episodes: it keeps per-episode state in ``state`` (the contract), or is run with
``max_concurrent_tools: 1``.

With ``chat_template: true`` an observation is rendered as the chat template's ``observation_role`` turn
(components.rollout.chat_turns, the segmenter the OpenAI endpoint appends messages with): only the new segment is
tokenised and appended, and the template must render the turns before it unchanged.

Each turn samples with the sampler's settings (`SamplingParams`) as configured or as given, passed per call and
never set on the sampler: the environment's stop tokens are added to ``stop_token_ids``, ``max_new_tokens`` is
capped at the room the roomiest open episode has left (so prompt + ``max_total_tokens`` bounds every position the
policy sees) and at the positions the policy has after the longest context (``max_position_embeddings``), and after the first turn it draws one sample per context (``group_size`` 1). Every data-parallel rank takes as
many turns as the busiest one (a sharded policy's forward is a collective): a rank whose episodes have all
ended samples a stand-in turn beside the others and discards it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import torch
from torch import Tensor, nn

from components.env import tool_concurrency
from components.env.tool_calls import stop_token_ids
from lightning_rl.core.batch import Prompts, RolloutBatch
from lightning_rl.core.contracts import Agent, Environment, Rollout, Turn, checked_step
from lightning_rl.core.hf_attributes import model_config
from lightning_rl.core.models import context_length
from lightning_rl.core.ops import all_reduce_sum
from lightning_rl.core.sampling_params import SamplingParams

from .chat_turns import ChatTemplate
from .episode import Episode, episode_batch, episode_metrics, left_pad, token_versions, transcript
from .interrupt import SamplingInterrupted, interruptible

_OBSERVATION = "OBSERVATION_TEXT_5b9d"  # a stand-in observation: the chat template is tried with it at setup


class MultiTurnRollout(Agent):
    """Multi-turn episodes: any token-in/token-out `Rollout` driven through an `Environment`, trained on the exact sampled ids.

    The sampler (``model.rollout``) samples each turn; the environment answers; its observation is appended
    as environment tokens (``action_mask`` 0). See the module docstring for the loop and its limits.
    """

    def __init__(
        self,
        env: Environment,
        max_turns: int = 4,
        max_total_tokens: int | None = None,
        chat_template: bool = False,
        observation_role: str = "tool",
        max_concurrent_tools: int | None = None,
    ):
        """
        Args:
            env: the environment (e.g. components.env.ToolEnvironment); one episode per sampled response.
            max_turns: most model turns per episode; an episode still open after them ends, flagged truncated.
            max_total_tokens: most response tokens per episode, the model's and the observations' together (None = the
                policy's context, max_position_embeddings, less the episode's prompt: the most that fits).
            chat_template: render observations as chat turns of the tokenizer's template (else their text is tokenised as is).
            observation_role: the chat role of an observation, with ``chat_template`` (``tool`` or ``user``).
            max_concurrent_tools: the environment's steps (tool calls) of one turn that run at once, across episodes
                (None = components.env.tool_concurrency(): 8 per core, 16 to 128; 1 = one after another).
        """
        if max_turns < 1 or (max_total_tokens is not None and max_total_tokens < 1):
            raise ValueError(
                f"MultiTurnRollout: max_turns ({max_turns}) and max_total_tokens ({max_total_tokens}) must be >= 1"
            )
        if max_concurrent_tools is not None and max_concurrent_tools < 1:
            raise ValueError(
                f"MultiTurnRollout: max_concurrent_tools must be >= 1 (or null), got {max_concurrent_tools}"
            )
        self.env, self.max_turns, self.max_total_tokens = env, max_turns, max_total_tokens
        self.chat_template, self.observation_role = chat_template, observation_role
        self.max_concurrent_tools = max_concurrent_tools or tool_concurrency()
        self.tokenizer, self.chat, self.stop_ids = None, None, []
        self._tools: ThreadPoolExecutor | None = None
        self._running, self._cancelled = set(), set()  # tokens of the generate calls under way, and of those to stop

    def setup(self, tokenizer, sampler: Rollout) -> None:
        """Resolve the environment's stop texts to token ids and check the sampler can drive episodes."""
        if sampler.params.greedy_baseline:
            raise ValueError(
                "model.agent (MultiTurnRollout) cannot run with a greedy baseline row (ReMax): set model.rollout.init_args.greedy_baseline: false"
            )
        self.tokenizer = tokenizer
        self.stop_ids = stop_token_ids(tokenizer, self.env.stop_texts, "model.agent.init_args.env")
        self.chat = self._observation_template(tokenizer) if self.chat_template else None

    def _observation_template(self, tokenizer) -> ChatTemplate:
        """The tokenizer's chat template, checked at setup (not at the first tool call of a run) to take an
        ``observation_role`` turn after the model's."""
        if not tokenizer.chat_template:
            raise ValueError(
                "model.agent.init_args.chat_template is true but the policy's tokenizer has no chat template; "
                "set chat_template: false (observations are then tokenised as plain text) or use a chat model"
            )
        template = ChatTemplate(tokenizer)
        try:
            self._observation_text(template, _OBSERVATION, [])
        except Exception as err:
            raise ValueError(
                f"the tokenizer's chat template cannot follow the model's turn with a {self.observation_role!r} turn "
                f"({type(err).__name__}: {err}); set model.agent.init_args.observation_role to a role it accepts "
                "(e.g. user), or chat_template: false"
            ) from None
        return template

    def _observation_text(self, template: ChatTemplate, observation: str, turn_ids: list[int]) -> str:
        """What is appended after a model turn that ended with ``turn_ids``: the observation as a chat turn."""
        return template.suffix(
            [{"role": self.observation_role, "content": observation}], None, turn_ids, append_only=True
        )

    # ------------------------------------------------------------------ the loop
    @torch.no_grad()
    def generate(
        self, sampler: Rollout, prompts: Prompts, policy: nn.Module, params: SamplingParams | None = None
    ) -> tuple[RolloutBatch, dict[str, Tensor]]:
        """Episodes for ``prompts`` (each starts from its prompt's data row), sampled by ``sampler`` with ``params``
        (None = its own). Returns the batch, whose columns hold ``completions`` (each episode's last model turn, what a
        reward judges) and ``transcripts`` (everything, observations marked), and the episodes' metrics."""
        if self.tokenizer is None:
            raise RuntimeError(
                "MultiTurnRollout.setup(tokenizer, sampler) must run before generate (RLModule.configure_model calls it)"
            )
        if prompts.images is not None:  # later turns re-encode the transcript as text: the images would be lost
            raise ValueError(
                "model.agent (multi-turn episodes) does not take prompts with images yet; drop model.agent or the data's image column"
            )
        params = params or sampler.params
        n, prompt_ids = len(prompts), prompts.prompt_ids
        contexts = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids.cpu(), prompts.prompt_mask.cpu())]
        positions = context_length(model_config(policy))
        if self.max_total_tokens is None and positions is None:
            raise ValueError(
                "model.agent (MultiTurnRollout): max_total_tokens is null (the policy's context less the prompt) but the "
                "policy's config gives no max_position_embeddings: set model.agent.init_args.max_total_tokens"
            )
        limit = (
            (lambda prompt: self.max_total_tokens)
            if self.max_total_tokens is not None
            else (lambda p: positions - len(p))
        )
        # no turn runs past a context's positions: a row of a batched sampler call sees as many new positions as any
        fits = (
            (lambda longest: positions - longest) if positions is not None else (lambda longest: params.max_new_tokens)
        )
        stops = tuple(dict.fromkeys([*params.stop_token_ids, *self.stop_ids]))
        run = object()
        self._running.add(run)  # cancel() ends the episodes of the calls in this set (from the first turn on)
        # a cancel ends a turn's sampling in flight (one process only: ranks sample in step, one cannot leave alone)
        stopped = (lambda: run in self._cancelled) if not _distributed() else (lambda: False)
        try:
            with interruptible(stopped):
                turn = sampler.generate(
                    prompts,
                    policy,
                    replace(
                        params,
                        stop_token_ids=stops,
                        max_new_tokens=max(
                            1,
                            min(params.max_new_tokens, max(map(limit, contexts)), fits(max(map(len, contexts)))),
                        ),
                    ),
                )
            g = turn.batch_size // n
            rows = prompts.rows()
            episodes = [Episode(contexts[i // g], self.env.reset(dict(rows[i // g]))) for i in range(turn.batch_size)]
            active, index = list(range(turn.batch_size)), 0
            while True:
                self._absorb(turn, [episodes[i] for i in active], index, limit, run)
                active = [i for i in active if not episodes[i].done]
                if not int(all_reduce_sum(torch.tensor(float(len(active)), device=prompt_ids.device))):  # on every rank
                    break
                index += 1
                sampled = active or [0]  # a rank whose episodes all ended samples a stand-in turn, discarded by _absorb
                context_ids, context_mask = left_pad(
                    [episodes[i].prompt + episodes[i].ids for i in sampled], sampler.pad_token_id, prompt_ids.device
                )
                # no turn runs past the roomiest episode's budget (a context never passes prompt + its limit) nor past
                # the policy's positions for the longest context
                longest = max(len(episodes[i].prompt) + len(episodes[i].ids) for i in sampled)
                room = max(
                    1, min(max(limit(episodes[i].prompt) - len(episodes[i].ids) for i in sampled), fits(longest))
                )
                turn_params = replace(
                    params, stop_token_ids=stops, group_size=1, max_new_tokens=min(params.max_new_tokens, room)
                )
                try:
                    with interruptible(stopped):
                        turn = sampler.generate(Prompts(context_ids, context_mask), policy, turn_params)
                except SamplingInterrupted:  # cancelled: the open episodes end here, as at their next turn
                    for i in active:
                        episodes[i].end(truncated=True)
                    break
        finally:
            self._running.discard(run)
            self._cancelled.discard(run)
        batch = episode_batch(episodes, prompts, g, sampler.pad_token_id)
        batch = batch.with_columns(
            completions=[self._decode(e.last_turn) for e in episodes],
            transcripts=[transcript(e, self._decode) for e in episodes],
        )
        return batch, episode_metrics(episodes)

    def _absorb(self, turn: RolloutBatch, episodes: list[Episode], index: int, limit, run: object = None) -> None:
        """Append each row's sampled turn to its episode, let the environment act, append its observation (once the
        ``generate`` call ``run`` is cancelled: end each episode at this turn, without the environment). ``limit``:
        an episode's prompt -> the most response tokens it may hold."""
        lengths = turn.response_mask.sum(-1).tolist()
        ids_rows = turn.response_ids.tolist()
        logprob_rows = turn.rollout_logprobs.tolist() if turn.rollout_logprobs is not None else None
        # each turn may come from another policy version (asynchronous training pushes weights between turns)
        version_rows = token_versions(turn).tolist()
        stepping = []  # (episode, its turn) for the environment
        for row, episode in enumerate(episodes):
            ids = ids_rows[row][: lengths[row]]
            room = limit(episode.prompt) - len(episode.ids)
            cut = len(ids) > room
            ids = ids[:room]
            finish = "length" if cut or bool(turn.truncated[row]) else "stop"
            episode.add(
                ids, 1, None if logprob_rows is None else logprob_rows[row][: len(ids)], version_rows[row][: len(ids)]
            )
            episode.turns, episode.last_turn = episode.turns + 1, ids
            if cut or run in self._cancelled:
                episode.end(truncated=True)
                continue
            stepping.append((episode, Turn(ids, self._turn_text(ids), finish, index)))
        for (episode, turn_), step in zip(stepping, self._steps(stepping, run)):
            if step is None:  # cancelled before its step started
                episode.end(truncated=True)
                continue
            step = checked_step(self.env, step)
            episode.tool_calls += step.tool_calls
            episode.tool_errors += step.tool_errors
            if step.reward is not None:
                episode.reward(float(step.reward))  # on the turn's last token
            if step.done:
                episode.end(truncated=turn_.finish == "length")
            elif index + 1 >= self.max_turns:
                episode.end(truncated=True, max_turns=True)
            else:
                observation = self._observation_ids(step.observation, turn_.ids)
                if len(episode.ids) + len(observation) + 1 > limit(episode.prompt):  # no room for it and one more token
                    episode.end(truncated=True)
                else:
                    episode.add(observation, 0, None)

    def _steps(self, stepping: list, run: object) -> list:
        """``env.step`` of each (episode, turn), at most ``max_concurrent_tools`` at once, in order; None for a step
        not started before the ``generate`` call ``run`` was cancelled. An environment's exception is raised (the first
        in order), as one step after another would."""

        def step(episode: Episode, turn: Turn):
            return None if run in self._cancelled else self.env.step(episode.state, turn)

        if self.max_concurrent_tools == 1 or len(stepping) <= 1:
            return [step(episode, turn) for episode, turn in stepping]
        if self._tools is None:
            self._tools = ThreadPoolExecutor(self.max_concurrent_tools, thread_name_prefix="tool-call")
        futures = [self._tools.submit(step, episode, turn) for episode, turn in stepping]
        return [future.result() for future in futures]

    def _observation_ids(self, observation: str | list[int], turn_ids: list[int]) -> list[int]:
        if not isinstance(observation, str):
            vocab = len(self.tokenizer)
            bad = [t for t in observation if not 0 <= t < vocab]
            if bad:
                raise ValueError(
                    f"{type(self.env).__name__}.step returned observation token ids outside the vocabulary [0, {vocab}): {bad[:5]}"
                )
            return list(observation)
        if self.chat is not None:
            observation = self._observation_text(self.chat, observation, turn_ids)
        return self.tokenizer.encode(observation, add_special_tokens=False)

    # ------------------------------------------------------------------ texts
    def _turn_text(self, ids: list[int]) -> str:
        """What the environment reads: special tokens kept (a protocol's tags may be special), the closing EOS dropped."""
        if ids and ids[-1] == self.tokenizer.eos_token_id:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def cancel(self) -> None:
        """Stop the `generate` calls under way on other threads (a round sampled ahead, when the run is interrupted): their
        episodes end at the next turn, and the environment is closed, which ends its tool calls under way."""
        self._cancelled |= self._running
        self.env.close()

    def close(self) -> None:
        self.env.close()
        if self._tools is not None:
            self._tools.shutdown(wait=False, cancel_futures=True)
            self._tools = None


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
