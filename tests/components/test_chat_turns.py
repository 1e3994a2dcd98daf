"""The one chat-turn segmenter (components.rollout.chat_turns.ChatTemplate), as MultiTurnRollout appends observations
with it (``append_only``) and as the OpenAI endpoint appends messages: with an append-only template the appended ids
equal a full re-render of the conversation; with one that rewrites earlier turns the transcript keeps the ids that were
sampled."""

from __future__ import annotations

import string

import pytest

from components.rollout import MultiTurnRollout
from components.rollout.chat_turns import ChatTemplate
from lightning_rl.core.contracts import Environment, Step
from tests.fixtures.chat_templates import FAMILIES, family_tokenizer
from tests.helpers import prompts
from tests.support.multi_turn import Echo, Scripted

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


def _observation(template: ChatTemplate, role: str, text: str, turn_ids: list[int], append_only: bool = True) -> str:
    return template.suffix([{"role": role, "content": text}], None, turn_ids, append_only=append_only)


def test_segment_glue_and_roles():
    tok = chat_tokenizer(CHATML)
    chat = ChatTemplate(tok)
    # the model ended its turn with <|im_end|>: the template's "\n" after it, then the new turn and the assistant header
    segment = _observation(chat, "user", "hi", [5, tok.eos_token_id])
    assert segment == "\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    # a turn that stopped on a tool tag, without <|im_end|>: the end-of-turn token comes from the template
    assert _observation(chat, "user", "hi", [5]).startswith("<|im_end|>\n<|im_start|>user\n")
    assert _observation(chat, "tool", "hi", []) == "<|im_end|>\n<|im_start|>tool\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert chat.end_of_turn == "<|im_end|>\n" and chat.end_of_turn_id() == tok.eos_token_id
    sampler = Scripted([], tok.eos_token_id)
    with pytest.raises(ValueError, match="chat_template is true but the policy's tokenizer has no chat template"):
        MultiTurnRollout(Echo(), chat_template=True).setup(chat_tokenizer(None), sampler)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("role", ["tool", "user"])
def test_both_callers_append_a_full_renders_ids_on_each_familys_template(family, role):
    # MultiTurnRollout (append_only) and the endpoint cut the same segment from an append-only template, and it is what
    # a full render of the conversation adds after the model's sampled turn (its end-of-turn token included)
    tok = family_tokenizer(family)
    chat, eos = ChatTemplate(tok), tok.eos_token_id
    user, turn = [{"role": "user", "content": "What is 1+2?"}], "<call>1+2</call>"
    turn_ids = tok.encode(turn, add_special_tokens=False) + [eos]
    appended = [_observation(chat, role, "<result>3</result>", turn_ids, append_only) for append_only in (True, False)]
    assert appended[0] == appended[1]
    conversation = user + [{"role": "assistant", "content": turn}, {"role": role, "content": "<result>3</result>"}]
    sampled = _render(tok, user, generation_prompt=True) + turn_ids
    full = _render(tok, conversation, generation_prompt=True)
    assert sampled + tok.encode(appended[0], add_special_tokens=False) == full


def test_append_only_refuses_a_template_that_rewrites_the_turn_before_where_the_endpoint_takes_what_follows():
    # the model's turn is marked [last] while it is the last one: an observation after it would change rendered ids
    marks_last = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if loop.last and m.role == 'assistant' %}[last]{% endif %}"
        "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok = chat_tokenizer(marks_last)
    chat = ChatTemplate(tok)
    with pytest.raises(ValueError, match="renders the conversation differently once a 'tool' turn follows"):
        _observation(chat, "tool", "3", [tok.eos_token_id])
    assert _observation(chat, "tool", "3", [tok.eos_token_id], append_only=False) == (
        "\n<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(ValueError, match=r"cannot follow the model's turn with a 'tool' turn \(ValueError: the chat"):
        MultiTurnRollout(Echo(), chat_template=True).setup(tok, Scripted([], tok.eos_token_id))


def test_a_template_that_does_not_render_an_assistant_turn_fails_at_once():
    with pytest.raises(ValueError, match="does not render an assistant message's content"):
        ChatTemplate(
            chat_tokenizer("{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}")
        )


def test_a_template_that_refuses_the_observation_role_fails_at_setup():
    # like Mistral's and Gemma's: only user and assistant turns
    strict = (
        "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('Only user and assistant roles are supported!') }}"
        "{% endif %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    tok = chat_tokenizer(strict)
    sampler = Scripted([], tok.eos_token_id)
    with pytest.raises(
        ValueError,
        match=r"cannot follow the model's turn with a 'tool' turn \(TemplateError: Only user and assistant roles .*observation_role",
    ):
        MultiTurnRollout(Echo(), chat_template=True, observation_role="tool").setup(tok, sampler)
    MultiTurnRollout(Echo(), chat_template=True, observation_role="user").setup(tok, sampler)
    assert _observation(ChatTemplate(tok), "user", "hi", []) == "[user]hi[assistant]"
