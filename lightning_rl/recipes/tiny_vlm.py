"""Tiny Qwen2-VL / Qwen2.5-VL models for the shipped visual task and for tests: a character-level tokenizer with the
Qwen2-VL vision tokens and a chat template, a PIL image processor, a small vision tower and text decoder (built
locally, nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHARS = list("0123456789abcdefghijklmnopqrstuvwxyz?+-*=.,: \n")
VISION_TOKENS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Qwen2-VL's layout (images as ``<|vision_start|><|image_pad|><|vision_end|>`` in the user turn), without its default system turn."""

PATCH, MERGE = 14, 2  # Qwen2-VL's: a token of the language model covers MERGE x MERGE patches of PATCH x PATCH pixels


def build_vlm_tokenizer():
    """One token per character (digits, lowercase letters, punctuation, space, newline) plus Qwen2-VL's chat and
    vision tokens; ``<|im_end|>`` ends a turn and is the EOS."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        extra_special_tokens=VISION_TOKENS,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_image_processor(min_pixels: int = 28 * 28, max_pixels: int = 112 * 112, patch_size: int = PATCH):
    """Qwen2-VL's image processor (PIL backend): images resized to a multiple of ``patch_size * 2`` pixels within the
    pixel bounds (Qwen3-VL's patches are 16 pixels)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        min_pixels=min_pixels, max_pixels=max_pixels, patch_size=patch_size, merge_size=MERGE, temporal_patch_size=2
    )


def build_tiny_vlm(
    tokenizer,
    family: str = "qwen2_vl",
    hidden_size: int = 32,
    layers: int = 2,
    heads: int = 2,
    vision_dim: int = 16,
    vision_depth: int = 1,
    seed: int = 0,
    max_positions: int = 512,
):
    """A randomly initialised Qwen2-VL (``family="qwen2_vl"``), Qwen2.5-VL (``"qwen2_5_vl"``) or Qwen3-VL (``"qwen3_vl"``:
    16-pixel patches, interleaved multimodal rotary positions, deepstack features) for ``tokenizer``."""
    import torch
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
    )

    ids = {
        name: tokenizer.convert_tokens_to_ids(tok)
        for name, tok in (
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
        )
    }
    head_dim = hidden_size // heads
    section = [head_dim // 8, head_dim * 3 // 16, head_dim * 3 // 16]  # time, height, width halves of the rotary dims
    section[0] += head_dim // 2 - sum(section)
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        rope_scaling={"type": "mrope", "mrope_section": section},
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    if family == "qwen2_vl":
        vision = dict(
            depth=vision_depth,
            embed_dim=vision_dim,
            hidden_size=hidden_size,
            num_heads=2,
            mlp_ratio=2,
            patch_size=PATCH,
            spatial_merge_size=MERGE,
            temporal_patch_size=2,
            in_channels=3,
        )
        config_class, model_class = Qwen2VLConfig, Qwen2VLForConditionalGeneration
    elif family == "qwen2_5_vl":
        vision = dict(
            depth=vision_depth,
            hidden_size=vision_dim,
            intermediate_size=2 * vision_dim,
            out_hidden_size=hidden_size,
            num_heads=2,
            patch_size=PATCH,
            spatial_merge_size=MERGE,
            temporal_patch_size=2,
            in_channels=3,
            window_size=56,
            fullatt_block_indexes=[vision_depth - 1],
        )
        config_class, model_class = Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    elif family == "qwen3_vl":
        vision = dict(
            depth=vision_depth,
            hidden_size=vision_dim,
            intermediate_size=2 * vision_dim,
            out_hidden_size=hidden_size,
            num_heads=2,
            patch_size=16,
            spatial_merge_size=MERGE,
            temporal_patch_size=2,
            in_channels=3,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
        )
        text.pop("rope_scaling")
        text.update(
            head_dim=head_dim,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": section,
                "mrope_interleaved": True,
            },
        )
        config_class, model_class = Qwen3VLConfig, Qwen3VLForConditionalGeneration
    else:
        raise ValueError(f"unknown family {family!r}: qwen2_vl, qwen2_5_vl or qwen3_vl")
    config = config_class(
        text_config=text,
        vision_config=vision,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        **ids,
    )
    torch.manual_seed(seed)
    model = model_class(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    return model


def save_vlm(model, tokenizer, image_processor, path: str | Path) -> str:
    """Write the model, tokenizer (with its chat template) and image processor where ``AutoProcessor`` (or, without
    torchvision, `lightning_rl.core.vision.load_processor`) reads them."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    image_processor.save_pretrained(path)
    return str(path)


def save_tiny_vlm(path: str | Path, family: str = "qwen2_vl", seed: int = 0, **sizes) -> str:
    """A random tiny vision-language model, tokenizer and image processor at ``path`` (a test fixture); returns the path."""
    tokenizer = build_vlm_tokenizer()
    processor = build_image_processor(patch_size=16 if family == "qwen3_vl" else PATCH)
    return save_vlm(build_tiny_vlm(tokenizer, family, seed=seed, **sizes), tokenizer, processor, path)
