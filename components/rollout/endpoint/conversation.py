"""`Conversation`: one episode's calls to the endpoint as training rows of exact token ids (TITO: tokens in, tokens out).

Each call continues the episode's current row when the request repeats what the row holds: for a chat call, the
messages of the row's calls and the replies the endpoint gave, in order; for a completion, the row's text (or ids).
The next prompt is then the row's recorded ids plus the tokens of only the new messages (``ChatTemplate.suffix``)
or the new text, never a re-render or re-tokenisation of what was sampled. A request that does not repeat the row
(the agent dropped an earlier turn's reasoning, edited a message, or asks again for the same turn) starts a new row
from a full render and counts a prefix break: no row ever holds tokens that nobody sampled in its place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..chat_turns import ChatTemplate
from ..episode import Episode
from .chat import ContextFull, encode_within, longest_token_bytes, normalized

__all__ = ["Conversation", "ContextFull", "RowLimit", "Pending", "Row"]


class RowLimit(ValueError):
    """The call would start a row past the episode's ``max_rows``."""


@dataclass
class Row:
    """A training row under construction: ``episode`` holds its first prompt and the ids after it."""

    episode: Episode
    kind: str  # "chat" or "text"
    covers: list = field(default_factory=list)  # chat: the normalised messages the ids hold; text: [the text]
    tools: str = ""  # chat: the tool definitions the row was rendered with (JSON)
    last_turn: list[int] = field(default_factory=list)

    @property
    def context(self) -> list[int]:
        return self.episode.prompt + self.episode.ids


@dataclass
class Pending:
    """A call prepared: the row it extends (or starts), the ids appended before sampling, the whole context."""

    row: Row
    added: list[int]
    context: list[int]
    covers: list
    new_row: bool


class Conversation:
    """The rows of one episode, and its prefix breaks."""

    def __init__(
        self,
        template: ChatTemplate | None,
        tokenizer,
        max_total_tokens: int | None,
        max_rows: int = 16,
        context: int | None = None,
        longest: int | None = None,
    ):
        """``max_total_tokens``: the most response tokens of a row (None = the policy's context less the row's prompt);
        ``context``: the policy's positions (None = unknown: prompts are not bounded here, and ``max_total_tokens``
        must be given); ``longest``: the most bytes one token stands for (chat.longest_token_bytes; None = computed)."""
        if max_total_tokens is None and context is None:
            raise ValueError(
                "Conversation: max_total_tokens is None (the policy's context less the prompt) but the policy's context "
                "is unknown: give max_total_tokens"
            )
        self.template, self.tokenizer, self.max_total_tokens, self.max_rows = (
            template,
            tokenizer,
            max_total_tokens,
            max_rows,
        )
        self.context = context
        self.longest = longest or longest_token_bytes(tokenizer)
        self.rows: list[Row] = []
        self.prefix_breaks = 0
        self.calls = 0
        self._busy: set[int] = set()  # id() of the rows a call in flight extends
        self._starting = 0  # rows that calls in flight start

    def chat(self, messages: list[dict], tools: list[dict] | None) -> Pending:
        if self.template is None:
            raise ValueError("this endpoint has no chat template; call /v1/completions")
        if not messages:
            raise ValueError("messages is empty")
        covers, tools_key = [normalized(m) for m in messages], json.dumps(tools or [], sort_keys=True)
        row = self._current("chat")
        n = len(row.covers) if row is not None else 0
        if row is not None and row.tools == tools_key and len(covers) > n and covers[:n] == row.covers:
            added = self._encode(self.template.suffix(messages[n:], tools, row.last_turn), self._added_budget(row))
            return self._pending(row, added, covers)
        prompt = self._encode(self.template.prompt(messages, tools), self._prompt_budget())
        return self._start(Row(Episode(prompt, None), "chat", tools=tools_key), covers)

    def _prompt_budget(self) -> tuple[int | None, type]:
        """A new row's prompt: the policy's context less one sampled token."""
        context = self.context

        def too_long(at_least: int) -> ContextFull:
            return ContextFull(
                f"the prompt is at least {at_least} tokens, and the policy's context (max_position_embeddings) is "
                f"{context}: no room to sample a token"
            )

        return (None if context is None else context - 1), too_long

    def limit(self, row: Row) -> int:
        """The most response tokens ``row`` may hold: ``max_total_tokens``, or the policy's context less its prompt."""
        if self.max_total_tokens is not None:
            return self.max_total_tokens
        return self.context - len(row.episode.prompt)

    def _limit_text(self, row: Row) -> str:
        if self.max_total_tokens is not None:
            return f"model.agent.init_args.max_total_tokens is {self.max_total_tokens}"
        return (
            f"the policy's context (max_position_embeddings {self.context}) less the row's prompt "
            f"({len(row.episode.prompt)}) leaves {self.limit(row)}"
        )

    def _added_budget(self, row: Row) -> tuple[int, type]:
        """What a call adds to ``row``: its room under `limit` (one token left to sample)."""
        room = self.limit(row) - len(row.episode.ids) - 1

        def too_long(at_least: int) -> ContextFull:
            return ContextFull(
                f"this conversation's training row holds {len(row.episode.ids)} tokens and the call adds at least "
                f"{at_least}, and {self._limit_text(row)}: no room for another turn"
            )

        return room, too_long

    def text(self, prompt: str | list[int]) -> Pending:
        row = self._current("text")
        if isinstance(prompt, list):  # token ids: the row continues when they start with its ids
            if row is not None and len(prompt) > len(row.context) and prompt[: len(row.context)] == row.context:
                return self._pending(row, prompt[len(row.context) :], [None])
            return self._start(Row(Episode(list(prompt), None), "text"), [None])
        done = row.covers[0] if row is not None else None
        if isinstance(done, str) and len(prompt) > len(done) and prompt.startswith(done):
            added = self._encode(prompt[len(done) :], self._added_budget(row))
            return self._pending(row, added, [prompt])
        ids = self._encode(prompt, self._prompt_budget())
        return self._start(Row(Episode(ids, None), "text"), [prompt])

    def _encode(self, text: str, budget: tuple[int | None, type]) -> list[int]:
        """``text``'s ids, refused untokenised when it cannot fit ``budget`` (chat.encode_within)."""
        return encode_within(self.tokenizer, text, budget[0], self.longest, budget[1])

    def _current(self, kind: str) -> Row | None:
        row = self.rows[-1] if self.rows and self.rows[-1].kind == kind else None
        return None if row is None or id(row) in self._busy else row

    def _pending(self, row: Row, added: list[int], covers: list) -> Pending:
        if len(row.episode.ids) + len(added) + 1 > self.limit(row):
            row.episode.truncated = True
            raise ContextFull(
                f"this conversation's training row holds {len(row.episode.ids)} + {len(added)} new tokens, and "
                f"{self._limit_text(row)}: no room for another turn"
            )
        self._busy.add(id(row))
        return Pending(row, added, row.context + added, covers, False)

    def _start(self, row: Row, covers: list) -> Pending:
        if not row.episode.prompt:
            raise ValueError("the prompt is empty")
        if len(self.rows) + self._starting >= self.max_rows:
            raise RowLimit(
                f"this episode already has {len(self.rows) + self._starting} training rows (each call that does not "
                "continue the conversation as served, or that runs beside another, starts one), and "
                f"model.agent.init_args.max_rows_per_episode is {self.max_rows}"
            )
        self._starting += 1
        return Pending(row, [], list(row.episode.prompt), covers, True)

    def release(self, pending: Pending) -> None:
        """The call ends without a sampled turn (refused after it was prepared, or its sampling was interrupted)."""
        if pending.new_row:
            self._starting -= 1
        else:
            self._busy.discard(id(pending.row))

    def room(self, pending: Pending) -> int:
        """The most tokens the call may sample."""
        return max(1, self.limit(pending.row) - len(pending.row.episode.ids) - len(pending.added))

    def commit(
        self,
        pending: Pending,
        ids: list[int],
        logprobs: list[float] | None,
        versions: list[int],
        reply: Any,
        truncated: bool,
    ) -> None:
        """Record the sampled turn; ``reply`` is what the endpoint answers (the assistant message, or the text)."""
        row = pending.row
        self.release(pending)
        if pending.new_row:
            if self.rows:
                self.prefix_breaks += 1
            self.rows.append(row)
        row.episode.add(pending.added, 0, None)
        row.episode.add(ids, 1, logprobs, versions)
        row.episode.turns += 1
        row.episode.truncated = truncated
        row.last_turn = ids
        row.covers = (
            pending.covers + [normalized(reply)]
            if row.kind == "chat"
            else [None if pending.covers[0] is None else pending.covers[0] + reply]
        )
        self.calls += 1
