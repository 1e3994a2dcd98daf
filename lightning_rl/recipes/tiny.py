"""Tiny character-level models for the embedded default and for tests (built locally, nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHARS = list("0123456789+-*= ")


TOOL_TAGS = ["<call>", "</call>", "<result>", "</result>"]
"""One token each in the tool-using tiny policy's vocabulary (components.env.ToolProtocol's default tags)."""


def build_char_tokenizer(tags: list[str] | None = None):
    """A fast tokenizer with one token per character of the built-in task (digits, + - * =, space), and one per tag in ``tags``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS + list(tags or []))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    if tags:  # matched whole, before the one-character split; not special, so decoded text keeps them
        from tokenizers import AddedToken

        core.add_tokens([AddedToken(t, special=False, normalized=False) for t in tags])
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def build_tiny_llama(tokenizer, hidden_size: int = 128, layers: int = 4, heads: int = 4, seed: int = 0, max_positions: int = 64):
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


def save_tiny(path: str | Path, hidden_size: int = 32, layers: int = 2, heads: int = 2, seed: int = 0) -> str:
    """Write a random tiny Llama + tokenizer to ``path`` (a test fixture); returns the path."""
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, hidden_size, layers, heads, seed)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def supervised_step(model, optimizer, ids, labels, pad_token_id: int, step: int, lr: float, warmup: int, max_steps: int) -> float:
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
