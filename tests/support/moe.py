"""Random mixture-of-experts policies of the families transformers ships, with the tiny character tokenizer (built
locally): Qwen3-MoE (the shipped asset's family), OLMoE and Mixtral."""

from __future__ import annotations

from pathlib import Path

import torch

FAMILIES = ("qwen3_moe", "olmoe", "mixtral")


def build_moe(family: str, hidden: int = 64, layers: int = 2, experts: int = 4, top_k: int = 2, seed: int = 0):
    """A random ``family`` model for the character vocabulary, heads of 32 dimensions, ``experts`` experts of 32 units."""
    from transformers import MixtralConfig, MixtralForCausalLM, OlmoeConfig, OlmoeForCausalLM

    from lightning_rl.recipes.tiny import build_char_tokenizer, build_tiny_qwen3_moe

    tokenizer = build_char_tokenizer()
    if family == "qwen3_moe":
        model = build_tiny_qwen3_moe(tokenizer, hidden, layers, hidden // 32, experts, top_k, 32, seed)
        return model, tokenizer
    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=32, num_hidden_layers=layers,
        num_attention_heads=hidden // 32, num_key_value_heads=hidden // 32, num_experts_per_tok=top_k,
        max_position_embeddings=64, tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )  # fmt: skip
    if family == "olmoe":
        model = OlmoeForCausalLM(OlmoeConfig(num_experts=experts, **common))
    elif family == "mixtral":
        model = MixtralForCausalLM(MixtralConfig(num_local_experts=experts, head_dim=32, **common))
    else:
        raise ValueError(f"unknown family {family!r}: one of {FAMILIES}")
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def save_moe(path: str | Path, family: str = "qwen3_moe", **kwargs) -> str:
    """`build_moe` written to ``path`` with its tokenizer; returns the path."""
    model, tokenizer = build_moe(family, **kwargs)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
