"""Sampled VLM batches shared by the vision-language tests (tests/lightning_rl/test_vlm_exactness.py, test_vlm_update.py),
and image files for the data tests (test_vlm_data.py, the fault matrix)."""

from __future__ import annotations

import struct
import zlib

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
