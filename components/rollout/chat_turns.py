"""`ChatTurns`: an observation as the chat template's next turn, tokenised on its own and appended.

The template is rendered for a stand-in conversation with and without the observation turn; the
difference is the new segment (the observation turn and the next assistant header). What the template
writes after an assistant message's content (e.g. ``<|im_end|>\\n``) is prepended, less the end-of-turn
token the model already sampled. Previous turns are never rendered again: where a template is
append-only this gives the ids a full re-render would; where it is not (e.g. one that drops earlier
turns' reasoning) the transcript keeps the ids that were actually sampled.
"""

from __future__ import annotations

_USER, _ASSISTANT, _OBSERVATION = "USER_TEXT_1f3a", "ASSISTANT_TEXT_7c2e", "OBSERVATION_TEXT_5b9d"


class ChatTurns:
    def __init__(self, tokenizer, role: str = "tool"):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "model.agent.init_args.chat_template is true but the policy's tokenizer has no chat template; "
                "set chat_template: false (observations are then tokenised as plain text) or use a chat model"
            )
        self.tokenizer, self.role = tokenizer, role
        base = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT}]
        self.base = base
        self.prefix = tokenizer.apply_chat_template(base, tokenize=False)
        if _ASSISTANT not in self.prefix:
            raise ValueError(
                "the tokenizer's chat template does not render an assistant message's content; it cannot frame observations"
            )
        self.after_assistant = self.prefix[self.prefix.rindex(_ASSISTANT) + len(_ASSISTANT) :]  # e.g. "<|im_end|>\n"
        try:  # at setup, not at the first tool call of a run
            self.segment(_OBSERVATION, [])
        except Exception as err:
            raise ValueError(
                f"the tokenizer's chat template cannot follow the model's turn with a {role!r} turn ({type(err).__name__}: {err}); "
                "set model.agent.init_args.observation_role to a role it accepts (e.g. user), or chat_template: false"
            ) from None

    def segment(self, observation: str, turn_ids: list[int]) -> str:
        """The text appended after a model turn that ended with ``turn_ids``."""
        full = self.tokenizer.apply_chat_template(
            [*self.base, {"role": self.role, "content": observation}], tokenize=False, add_generation_prompt=True
        )
        if not full.startswith(self.prefix):
            raise ValueError(
                f"the chat template renders the conversation differently once a {self.role!r} turn follows; it cannot append observations"
            )
        glue = self.after_assistant
        if turn_ids:  # the model's own end-of-turn token is already in the transcript
            ended = self.tokenizer.decode(turn_ids[-1:], skip_special_tokens=False)
            if ended and glue.startswith(ended):
                glue = glue[len(ended) :]
        return glue + full[len(self.prefix) :]

    def observation_ids(self, observation: str, turn_ids: list[int]) -> list[int]:
        return self.tokenizer.encode(self.segment(observation, turn_ids), add_special_tokens=False)
