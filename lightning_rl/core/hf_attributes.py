"""What we read of transformers' objects whose attributes vary by model family or version (a model's config and its
family-specific fields, a classifier's head, a processor's parts): read here, by name, in one place (`_optional`), so
the rest of the code asks for what it means."""

from __future__ import annotations

from typing import Any

from torch import nn


def _optional(config: Any, name: str) -> Any:
    """``config.<name>``, or None where this family's config (or a missing config) has no such attribute."""
    return getattr(config, name, None)


def model_config(model: nn.Module | None):
    """A model's transformers config (`PretrainedConfig`); None for a module that has none (a toy model, a wrapper)."""
    return _optional(model, "config")


def text_config(config) -> Any:
    """A vision-language model's text-model config (its ``text_config``); None for a text model's config."""
    return _optional(config, "text_config")


def attention_settings(config) -> tuple[str | None, int | None]:
    """A config's attention backend (``sdpa``, ``eager``, ``flash_attention_2``, ...) and sliding window (None: full
    attention); (None, None) for no config."""
    return _optional(config, "_attn_implementation"), _optional(config, "sliding_window")


def image_token_id(config) -> int | None:
    """The id of a vision-language model's image placeholder token (None: a text model, or no config)."""
    return _optional(config, "image_token_id")


def _positive(config, name: str) -> int | None:
    """``name`` from the config or, for a vision-language model, its text model's config: a positive int, or None."""
    for part in (config, text_config(config)):
        value = _optional(part, name)
        if isinstance(value, int) and value > 0:
            return value
    return None


def context_length(config) -> int | None:
    """The positions a model was built for: its config's ``max_position_embeddings`` (a vision-language model's is
    its text model's); None when the config does not say."""
    return _positive(config, "max_position_embeddings")


def experts_per_token(config) -> int | None:
    """k, the experts a mixture-of-experts model routes each token to (``num_experts_per_tok``; a vision-language
    model's text model's); None when the config does not say."""
    return _positive(config, "num_experts_per_tok")


def is_vision_language(config) -> bool:
    """Whether a model config is a vision-language model's (a text decoder reading image tokens: it has a vision tower)."""
    return _optional(config, "vision_config") is not None


def architectures(config) -> list[str]:
    """The model classes a checkpoint's config names (``architectures``; [] when it names none)."""
    return list(_optional(config, "architectures") or [])


def child(module: nn.Module, name: str) -> nn.Module | None:
    """A transformers model's direct submodule by its attribute name (a classifier's ``score`` head, a task model's
    inner ``model``), or None where this family names it otherwise."""
    return dict(module.named_children()).get(name)


def processor_parts(processor) -> tuple[Any, Any]:
    """A multimodal processor's image processor and tokenizer (None for a part it does not have)."""
    return _optional(processor, "image_processor"), _optional(processor, "tokenizer")


def image_token(tokenizer) -> str | None:
    """The image placeholder text a vision-language tokenizer declares (``image_token``), or None."""
    return _optional(tokenizer, "image_token")
