"""Tiny character-level models for the embedded default and for tests (built locally, nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHARS = list("0123456789+-*= ")


TOOL_TAGS = ["<call>", "</call>", "<result>", "</result>"]
"""One token each in the tool-using tiny policy's vocabulary (components.env.ToolProtocol's default tags)."""


def filler_tokens(n: int) -> list[str]:
    """``n`` distinct tokens of letters after a tilde (``~a``, ``~b``, ..., ``~ba``, ...): no digit, operator or space."""
    names = []
    for i in range(n):
        letters = ""
        while True:
            i, r = divmod(i, 26)
            letters = chr(97 + r) + letters
            if i == 0:
                break
        names.append("~" + letters)
    return names


def build_char_tokenizer(tags: list[str] | None = None, vocab_size: int | None = None):
    """A fast tokenizer with one token per character of the built-in task (digits, + - * =, space), and one per tag in ``tags``.

    ``vocab_size``: pad the vocabulary with `filler_tokens` to this size, for a model with a full-sized vocabulary
    (e.g. Qwen2's 151,936) whose every sampled id must decode; text is still encoded one task character per token.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = SPECIALS + CHARS + list(tags or [])
    tokens += filler_tokens(max(0, (vocab_size or 0) - len(tokens)))
    vocab = {tok: i for i, tok in enumerate(tokens)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    if tags:  # matched whole, before the one-character split; not special, so decoded text keeps them
        from tokenizers import AddedToken

        core.add_tokens([AddedToken(t, special=False, normalized=False) for t in tags])
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def build_tiny_llama(
    tokenizer, hidden_size: int = 128, layers: int = 4, heads: int = 4, seed: int = 0, max_positions: int = 64
):
    """A randomly initialised Llama for the character vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=3 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def build_tiny_qwen3_moe(
    tokenizer,
    hidden_size: int = 128,
    layers: int = 4,
    heads: int = 4,
    experts: int = 8,
    top_k: int = 2,
    expert_size: int = 48,
    seed: int = 0,
    max_positions: int = 64,
):
    """A randomly initialised Qwen3-MoE for the character vocabulary: every layer's MLP is ``experts`` experts of
    ``expert_size`` hidden units, ``top_k`` of them per token (8 x 48 = the dense tiny Llama's 384 units in all, 96
    active). Heads of ``hidden_size / heads`` dimensions (32 by default: vLLM's CPU attention has no kernel for 16)."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=experts * expert_size,
        moe_intermediate_size=expert_size, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=heads, head_dim=hidden_size // heads, num_experts=experts, num_experts_per_tok=top_k,
        norm_topk_prob=True, max_position_embeddings=max_positions, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )  # fmt: skip
    model = Qwen3MoeForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_tiny(path: str | Path, hidden_size: int = 32, layers: int = 2, heads: int = 2, seed: int = 0) -> str:
    """Write a random tiny Llama + tokenizer to ``path`` (a test fixture); returns the path."""
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, hidden_size, layers, heads, seed)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def supervised_step(
    model, optimizer, ids, labels, pad_token_id: int, step: int, lr: float, warmup: int, max_steps: int
) -> float:
    """One next-token cross-entropy step of the scripts that train the shipped tiny models (``labels`` -100 = not
    trained on), at ``lr`` with linear warmup over ``warmup`` steps times a cosine decay over ``max_steps``. Returns
    the loss."""
    import math

    model.train()
    for group in optimizer.param_groups:
        group["lr"] = lr * min(1.0, step / warmup) * 0.5 * (1 + math.cos(math.pi * step / max_steps))
    loss = model(input_ids=ids, attention_mask=(ids != pad_token_id).long(), labels=labels).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
