"""`Episode`: one multi-turn transcript under construction, and what is built from a finished batch of them.

An episode's ids are the model's turns and the environment's observations in order, exactly as sampled
and appended; each id carries an action flag (1: the model sampled it, 0: the environment's), the
sampler's log-prob (0 on observations) and a reward slot (an environment's per-turn reward sits on the
turn's last token). `episode_batch` lays finished episodes out as one `RolloutBatch` row each,
`episode_metrics` summarises them (agent/..., tool/...), `transcript` renders one with the
environment's parts marked.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from lightning_rl.core.batch import Prompts, RolloutBatch

ENV_MARK = ("[[env: ", "]]")
"""How an observation is marked in the transcripts shown as samples."""


class Episode:
    """One transcript under construction: ids with their action flags, sampler log-probs and rewards."""

    def __init__(self, prompt: list[int], state: Any):
        self.prompt, self.state = prompt, state
        self.ids: list[int] = []
        self.action: list[int] = []
        self.logprobs: list[float] | None = []
        self.rewards: list[float] = []
        self.versions: list[int] = []  # the policy version of each token (an observation's: the turn's before it)
        self.last_turn: list[int] = []
        self.turns = self.tool_calls = self.tool_errors = 0
        self.done = self.truncated = self.max_turns = False

    def add(self, ids: list[int], action: int, logprobs: list[float] | None, versions: list[int] | None = None) -> None:
        """``versions``: the policy version that sampled each id (None: the version of the tokens before them, or 0)."""
        self.ids += ids
        self.versions += versions if versions is not None else [self.versions[-1] if self.versions else 0] * len(ids)
        self.action += [action] * len(ids)
        self.rewards += [0.0] * len(ids)
        if action and logprobs is None:
            self.logprobs = None  # the sampler reports none
        elif self.logprobs is not None:
            self.logprobs += logprobs if action else [0.0] * len(ids)

    def reward(self, value: float) -> None:
        """An environment's reward for the turn just taken, on the model's last token so far: the turn's last token,
        or for a turn the sampler returned empty the previous turn's, never an observation (no model token: none)."""
        last = next((i for i in range(len(self.action) - 1, -1, -1) if self.action[i]), None)
        if last is not None:
            self.rewards[last] += value

    def end(self, truncated: bool, max_turns: bool = False) -> None:
        self.done, self.truncated, self.max_turns = True, truncated, max_turns


def token_versions(turn: RolloutBatch) -> Tensor:
    """(B, R) the version of each token of one turn, from what the sampler reported (0 when it reports none)."""
    if turn.token_versions is not None:
        return turn.token_versions
    versions = turn.versions if turn.versions is not None else torch.zeros(turn.batch_size, dtype=torch.long)
    return versions[:, None].expand_as(turn.response_ids)


def episode_batch(episodes: list[Episode], prompts: Prompts, g: int, pad_token_id: int) -> RolloutBatch:
    """One row per episode, ``g`` consecutive episodes per prompt. Shapes: prompts (P_n, P) -> batch of B = P_n * g rows, R = the longest transcript."""
    device = prompts.prompt_ids.device
    return RolloutBatch(
        **prompts.per_row(g),
        **response_fields(episodes, pad_token_id, device),
        group_ids=torch.arange(len(prompts), device=device).repeat_interleave(g),
    )


def response_fields(episodes: list[Episode], pad_token_id: int, device) -> dict[str, Tensor]:
    """The `RolloutBatch` fields of finished episodes, one row each, right-padded to the longest: ids, masks, the
    sampler's log-probs, per-turn rewards, versions and the truncated flag. Shapes: -> (B, R) and (B,)."""
    b = len(episodes)
    width = max(1, max(len(e.ids) for e in episodes))
    response_ids = torch.full((b, width), pad_token_id, dtype=torch.long)  # (B, R)
    response_mask, action_mask, env_rewards = (
        torch.zeros(b, width, dtype=torch.long),
        torch.zeros(b, width, dtype=torch.long),
        torch.zeros(b, width),
    )
    logprobs = torch.zeros(b, width) if all(e.logprobs is not None for e in episodes) else None
    versions = torch.zeros(b, width, dtype=torch.long)  # (B, R)
    newest = max((v for e in episodes for v in e.versions), default=0)
    for i, e in enumerate(episodes):
        n = len(e.ids)
        versions[i, :n] = torch.tensor(e.versions, dtype=torch.long)
        response_ids[i, :n], response_mask[i, :n] = torch.tensor(e.ids, dtype=torch.long), 1
        action_mask[i, :n], env_rewards[i, :n] = torch.tensor(e.action, dtype=torch.long), torch.tensor(e.rewards)
        if logprobs is not None:
            logprobs[i, :n] = torch.tensor(e.logprobs)
    return dict(
        response_ids=response_ids.to(device),
        response_mask=response_mask.to(device),
        action_mask=action_mask.to(device),
        env_rewards=env_rewards.to(device),
        rollout_logprobs=None if logprobs is None else logprobs.to(device),
        truncated=torch.tensor([e.truncated for e in episodes], dtype=torch.bool, device=device),
        # an episode without a model token has nothing to be stale: it gets the newest version of the batch
        versions=torch.tensor(
            [min((v for v, a in zip(e.versions, e.action) if a), default=newest) for e in episodes], device=device
        ),
        token_versions=versions.to(device),
    )


def episode_metrics(episodes: list[Episode]) -> dict[str, Tensor]:
    """Means over the episodes; ``tool/error_frac`` is failed calls over all calls."""

    def mean(values) -> Tensor:
        return torch.tensor(sum(values) / max(1, len(values)), dtype=torch.float32)

    calls = sum(e.tool_calls for e in episodes)
    return {
        "agent/turns_mean": mean([e.turns for e in episodes]),
        "agent/tool_calls_mean": mean([e.tool_calls for e in episodes]),
        "tool/error_frac": torch.tensor(sum(e.tool_errors for e in episodes) / max(1, calls), dtype=torch.float32),
        "agent/observation_tokens_mean": mean([len(e.action) - sum(e.action) for e in episodes]),
        "agent/max_turns_frac": mean([float(e.max_turns) for e in episodes]),
    }


def transcript(episode: Episode, decode: Callable[[list[int]], str]) -> str:
    """The whole episode as text, each observation between ``ENV_MARK``s."""
    parts, start = [], 0
    for end in range(1, len(episode.ids) + 1):
        if end == len(episode.ids) or episode.action[end] != episode.action[start]:
            text = decode(episode.ids[start:end])
            parts.append(text if episode.action[start] else f"{ENV_MARK[0]}{text}{ENV_MARK[1]}")
            start = end
    return "".join(parts)


def left_pad(rows: list[list[int]], pad_token_id: int, device) -> tuple[Tensor, Tensor]:
    """Contexts as a left-padded batch. Shapes: -> (n, P'), (n, P')."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :], mask[i, width - len(r) :] = torch.tensor(r, dtype=torch.long), 1
    return ids.to(device), mask.to(device)
