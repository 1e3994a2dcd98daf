"""Observations as chat turns: with an append-only template the appended ids equal a full re-render of the
conversation; with one that rewrites earlier turns the transcript keeps the ids that were sampled."""

from __future__ import annotations

import string

import pytest

from components.rollout import MultiTurnRollout
from components.rollout.chat_turns import ChatTurns
from lightning_rl.core.contracts import Environment, Step
from tests.helpers import prompts
from tests.support.multi_turn import Scripted

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# like Qwen3's: an assistant turn followed by later turns loses its <think>...</think> part
DROPS_REASONING = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and not loop.last %}{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat_tokenizer(template: str):
    """One token per printable ASCII character, plus <|im_start|> and <|im_end|> (the end-of-turn / EOS token)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<|im_end|>", "<|im_start|>"]
    vocab = {tok: i for i, tok in enumerate(specials + list(string.printable))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<|im_end|>", additional_special_tokens=["<|im_start|>"]
    )
    tok.chat_template = template
    return tok


class Calc(Environment):
    """Answers the first turn with its result, then ends."""

    def step(self, state, turn):
        return Step("<result>3</result>") if turn.index == 0 else Step(done=True)


def _render(tok, messages, generation_prompt=False) -> list[int]:
    return tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt, return_dict=False)


def _episode(tok, turn_1: str, turn_2: str):
    user = [{"role": "user", "content": "What is 1+2?"}]
    prompt = _render(tok, user, generation_prompt=True)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    sampled = [enc(turn_1) + [tok.eos_token_id], enc(turn_2) + [tok.eos_token_id]]  # what the model sampled
    sampler = Scripted([[sampled[0]], [sampled[1]]], tok.eos_token_id)
    agent = MultiTurnRollout(
        Calc(), chat_template=True, max_total_tokens=256
    )  # no policy: no context to derive it from
    agent.setup(tok, sampler)
    batch, _ = agent.generate(sampler, prompts([prompt]), None)
    ours = prompt + batch.response_ids[0].tolist()
    conversation = user + [{"role": "assistant", "content": turn_1}, {"role": "tool", "content": "<result>3</result>"}]
    return ours, conversation, sampler, sampled


def test_appended_ids_equal_a_full_rerender_where_the_template_is_append_only():
    tok = chat_tokenizer(CHATML)
    ours, conversation, sampler, _ = _episode(tok, "<call>1+2</call>", "3")
    # the context of turn 2 is exactly the template's rendering of the conversation so far
    assert sampler.contexts[1][0] == _render(tok, conversation, generation_prompt=True)
    full = _render(tok, conversation + [{"role": "assistant", "content": "3"}])
    assert (
        ours == full[: len(ours)] and tok.decode(full[len(ours) :]) == "\n"
    )  # the template's newline after the last turn


def test_our_ids_are_kept_where_the_template_rewrites_earlier_turns():
    tok = chat_tokenizer(DROPS_REASONING)
    ours, conversation, sampler, sampled = _episode(tok, "<think>add</think><call>1+2</call>", "3")
    rerender = _render(tok, conversation, generation_prompt=True)
    assert tok.decode(rerender).count("<think>") == 0  # a re-render would train on tokens nobody sampled
    context = sampler.contexts[1][0]
    assert context != rerender
    start = len(_render(tok, conversation[:1], generation_prompt=True))
    assert context[start : start + len(sampled[0])] == sampled[0]  # the sampled turn, reasoning and all
    assert ours[start : start + len(sampled[0])] == sampled[0]


def test_segment_glue_and_roles():
    tok = chat_tokenizer(CHATML)
    chat = ChatTurns(tok, "user")
    # the model ended its turn with <|im_end|>: the template's "\n" after it, then the new turn and the assistant header
    assert chat.segment("hi", [5, tok.eos_token_id]) == "\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    # a turn that stopped on a tool tag, without <|im_end|>: the end-of-turn token comes from the template
    assert chat.segment("hi", [5]).startswith("<|im_end|>\n<|im_start|>user\n")
    with pytest.raises(ValueError, match="has no chat template"):
        ChatTurns(chat_tokenizer(None))


def test_a_template_that_refuses_the_observation_role_fails_at_setup():
    # like Mistral's and Gemma's: only user and assistant turns
    strict = (
        "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('Only user and assistant roles are supported!') }}"
        "{% endif %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    with pytest.raises(
        ValueError,
        match=r"cannot follow the model's turn with a 'tool' turn \(TemplateError: Only user and assistant roles .*observation_role",
    ):
        ChatTurns(chat_tokenizer(strict), "tool")
    assert ChatTurns(chat_tokenizer(strict), "user").segment("hi", []) == "[user]hi[assistant]"
