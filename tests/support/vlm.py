"""Sampled VLM batches shared by the vision-language tests (tests/lightning_rl/loop/test_vlm_exactness.py, test_vlm_update.py),
image files for the data tests (test_vlm_data.py) and the prompt-id check against transformers' own Qwen2-VL processor
(test_vision.py); the fault matrix runs the last two too."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import torch

from lightning_rl.core.models import ModelSpec, load_causal_lm, load_tokenizer
from tests.helpers import image_prompts, pictures


def mixed_prompts(path: str):
    """Four prompts of different lengths (left padding): two with the same text and same-sized images that differ in
    colour only (the same token ids), one with two images of different sizes, one without any."""
    return image_prompts(path, [
        ("how many?", pictures((56, 56, (200, 0, 0)))),
        ("how many?", pictures((56, 56, (0, 0, 200)))),
        ("count the shapes in both", pictures((84, 56, (0, 150, 0)), (28, 56, (90, 90, 90)))),
        ("no image here", []),
    ])  # fmt: skip


def sample(path: str, group_size: int, seed: int = 0, **kwargs):
    from components.rollout import HFRollout

    policy = load_causal_lm(ModelSpec(path=path))
    rollout = HFRollout(group_size=group_size, max_new_tokens=6, temperature=1.0, return_logprobs=True, **kwargs)
    rollout.setup(load_tokenizer(path))
    torch.manual_seed(seed)
    return policy, rollout.generate(mixed_prompts(path), policy)


def png_declaring(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` RGB pixels and holds none: its size is read from the header alone."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8 bits, RGB, deflate, no filter, no interlace
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


TINY_VLM = str(Path(__file__).parents[2] / "lightning_rl" / "assets" / "tiny-vlm")


def check_prompt_ids_match_transformers_own_processor(path: str = TINY_VLM) -> list[int]:
    """`VisionProcessor`'s ids and grids for prompts with two or three images of different sizes (in both orders) equal
    those of transformers' `Qwen2VLProcessor`; the sampler and the trainer share our ids, so only an independent
    processor tells a wrong expansion. Returns the image-token runs of the first prompt."""
    from transformers import AutoImageProcessor, Qwen2VLProcessor

    from lightning_rl.core.vision import load_processor

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        """Without its video half: the class check of a None video processor looks up a class that needs torchvision
        (absent from a CPU install); the ids come from the processor's own expansion."""

        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    tokenizer = load_tokenizer(path)
    ours = load_processor(path, tokenizer)
    reference = ImageOnlyQwen2VLProcessor(
        image_processor=AutoImageProcessor.from_pretrained(path), tokenizer=tokenizer, video_processor=None
    )
    images = pictures((84, 56, (0, 150, 0)), (28, 56, (90, 90, 90)), (56, 56, (200, 0, 0)))  # 6, 2 and 4 image tokens
    for shown in (images[:2], images[1::-1], images):
        ids, tensors = ours.encode("count the shapes", shown, system_prompt="be brief")
        chat = tokenizer.apply_chat_template(
            ours.messages("count the shapes", len(shown), "be brief"), add_generation_prompt=True, tokenize=False
        )
        expected = reference(text=[chat], images=shown, return_tensors="pt")
        assert ids == expected["input_ids"][0].tolist(), f"{len(shown)} images of sizes {[im.size for im in shown]}"
        assert tensors["image_grid_thw"].tolist() == expected["image_grid_thw"].tolist()
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    return [len(run) for run in "".join("x" if i == pad else " " for i in ours.encode("count", images[:2])[0]).split()]
