"""A vision-language policy's processor: a prompt's text and images in, its token ids and image tensors out.

The chat template places the images (one placeholder per image, before the text, in the user turn), then the
processor expands each placeholder to one token per image feature and computes the tensors the model reads
(``pixel_values``, ``image_grid_thw``, ...). The sampler and the trainer both read these ids and tensors, so they see
the same image tokens.

The processor is the model's own (``AutoProcessor``). Where that cannot be built (Qwen2-VL's needs torchvision for
its video half, which a CPU-only install may lack), a processor that follows Qwen2-VL's conventions is assembled from
its parts: the tokenizer, the image processor (``AutoImageProcessor``, which falls back to its PIL backend) and the
expansion rule of ``Qwen2VLProcessor`` (an image takes ``prod(image_grid_thw) / merge_size**2`` tokens).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lightning_rl.core.hf_attributes import image_token, processor_parts

TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")
"""Processor outputs that are per token (rebuilt for every forward from the ids), not image inputs."""


class VisionProcessor:
    """Turns (text, images) into (token ids, image tensors) for one prompt; built with `load_processor`."""

    def __init__(self, tokenizer, image_processor, processor=None, image_token: str | None = None):
        """``processor``: the model's own (None: expand ``image_token`` the way Qwen2-VL's processor does)."""
        self.tokenizer, self.image_processor, self.processor, self.image_token = (
            tokenizer,
            image_processor,
            processor,
            image_token,
        )

    def messages(self, text: str, n_images: int, system_prompt: str | None = None) -> list[dict]:
        """The chat: an optional system turn, then one user turn with the images first, then the text."""
        system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        return system + [{"role": "user", "content": [{"type": "image"}] * n_images + [{"type": "text", "text": text}]}]

    def encode(self, text: str, images: list, system_prompt: str | None = None) -> tuple[list[int], dict[str, Tensor]]:
        """Token ids of the prompt as the model reads it (chat template, generation prompt, image tokens expanded) and
        its image tensors ({} without images)."""
        chat = self.tokenizer.apply_chat_template(
            self.messages(text, len(images), system_prompt), add_generation_prompt=True, tokenize=False
        )
        if self.processor is not None:
            out = self.processor(text=[chat], images=images or None, return_tensors="pt")
            return out["input_ids"][0].tolist(), {k: v for k, v in out.items() if k not in TEXT_KEYS}
        tensors = dict(self.image_processor(images=images, return_tensors="pt")) if images else {}
        parts = chat.split(self.image_token)
        if len(parts) - 1 != len(images):
            raise ValueError(
                f"the chat template wrote {len(parts) - 1} image placeholder(s) ({self.image_token}) for {len(images)} image(s)"
            )
        if images:
            merge = self.image_processor.merge_size**2
            counts = (tensors["image_grid_thw"].prod(-1) // merge).tolist()
            chat = "".join(part + self.image_token * n for part, n in zip(parts, counts + [0]))
        return self.tokenizer(chat)["input_ids"], tensors


def load_processor(path: str, tokenizer, what: str = "model.policy.path") -> VisionProcessor:
    """The processor of the vision-language model at ``path`` (``tokenizer``: its tokenizer, as `load_tokenizer` set it up)."""
    from transformers import AutoImageProcessor, AutoProcessor

    from lightning_rl.core.models import load_pretrained

    try:
        processor = load_pretrained(AutoProcessor.from_pretrained, path, what)
    except ImportError as err:  # e.g. the video processor needs torchvision
        processor, missing = None, err
    image_processor, its_tokenizer = processor_parts(processor)
    if processor is not None and image_processor is not None:
        if its_tokenizer is not None:
            processor.tokenizer = tokenizer  # left padding and the pad token, as the text path sets them
        return VisionProcessor(tokenizer, image_processor, processor)
    try:
        image_processor = load_pretrained(AutoImageProcessor.from_pretrained, path, what)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"{what}: '{path}' has no image processor (preprocessor_config.json), so its prompts cannot carry images ({err})"
        ) from err
    image_token = _qwen_image_token(tokenizer, image_processor)
    if image_token is None:
        reason = (
            f"its processor could not be built ({missing})"
            if processor is None
            else f"{type(processor).__name__} is not an image processor"
        )
        raise ValueError(f"{what}: cannot turn images into inputs for '{path}': {reason}")
    return VisionProcessor(tokenizer, image_processor, image_token=image_token)


def _qwen_image_token(tokenizer, image_processor) -> str | None:
    """Qwen2-VL's image placeholder when the tokenizer and image processor follow its conventions, else None."""
    token = image_token(tokenizer) or "<|image_pad|>"
    known = token in tokenizer.get_vocab()
    return token if known and hasattr(image_processor, "merge_size") else None


def image_summary(images: list[Any]) -> str:
    """``2 images (40x30, 56x56)``: what a row's images are, for tables and messages."""
    if not images:
        return ""
    sizes = ", ".join(f"{im.width}x{im.height}" for im in images)
    return f"{len(images)} image{'s' if len(images) > 1 else ''} ({sizes})"
