"""Builders for test batches (import as `from tests.helpers import ...`)."""

from __future__ import annotations

import pytest
import torch

from lightning_rl.core.batch import RolloutBatch, terminal_rewards

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA_BF16 = ["--trainer.accelerator=gpu", "--trainer.devices=1", "--trainer.precision=bf16-mixed"]
"""CLI flags of a run on one GPU in bf16 autocast, as a GPU user runs it."""


def cpu_and_cuda(cpu, cuda) -> list:
    """``parametrize`` values of a test that runs here on CPU and, under ``pytest -m gpu`` on a GPU, on CUDA in bf16-mixed:
    ids ``cpu`` and ``cuda-bf16``."""
    return [pytest.param(cpu, id="cpu"), pytest.param(cuda, id="cuda-bf16", marks=[pytest.mark.gpu, needs_cuda])]


def batch_from_scores(
    scores, lengths=None, width: int | None = None, group_size: int | None = None, **fields
) -> RolloutBatch:
    """A RolloutBatch whose responses have ``lengths`` valid tokens (default 1) and the given scores."""
    scores = torch.as_tensor(scores, dtype=torch.float32)
    b = scores.shape[0]
    lengths = torch.as_tensor(lengths if lengths is not None else [1] * b)
    width = width or int(lengths.max())
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    group_size = group_size or b
    return RolloutBatch(
        response_ids=torch.randint(3, 10, (b, width)) * mask,
        response_mask=mask,
        scores=scores,
        token_rewards=terminal_rewards(scores, mask),
        group_ids=torch.arange(b) // group_size,
        sample_mask=torch.ones(b),
        **fields,
    )


def prompts(ids, mask=None, rows: list[dict] | None = None):
    """A `Prompts` batch from token ids (a (P_n, P) tensor or nested lists), an optional mask (default all ones) and
    each prompt's data row (default none)."""
    from lightning_rl.core.batch import Prompts

    ids = torch.as_tensor(ids)
    mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask)
    rows = rows or [{} for _ in range(ids.shape[0])]
    return Prompts(ids, mask, {k: [r[k] for r in rows] for k in rows[0]})


def pythonpath(*first) -> str:
    """PYTHONPATH for a child process the tests start: ``first``, this repository, then the parent's own entries, so
    packages installed with ``pip install --target`` (a GPU machine's carried wheels) stay importable there too."""
    import os
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[1])
    return os.pathsep.join(
        [*map(str, first), repo, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    )


def image_prompts(model_path: str, items: list[tuple[str, list]], system_prompt: str | None = None):
    """A `Prompts` batch of (text, images) pairs encoded by the policy's processor as the data module does (chat template,
    image tokens expanded, left padding, each prompt's images and image tensors)."""
    from lightning_rl.core.models import load_tokenizer
    from lightning_rl.core.vision import load_processor
    from lightning_rl.data.images import ImageColumn
    from lightning_rl.data.prompts import collate_prompts

    tokenizer = load_tokenizer(model_path)
    column = ImageColumn(load_processor(model_path, tokenizer), "test", "image", system_prompt)
    return collate_prompts(
        [{"prompt": text, "image": images} for text, images in items], tokenizer.pad_token_id, column
    )["prompts"]


def pictures(*specs: tuple[int, int, tuple[int, int, int]]):
    """PIL images of (width, height, RGB colour) with a white square in the corner, so equal sizes differ by colour only."""
    from PIL import Image, ImageDraw

    images = []
    for width, height, colour in specs:
        image = Image.new("RGB", (width, height), colour)
        ImageDraw.Draw(image).rectangle([2, 2, 9, 9], fill=(255, 255, 255))
        images.append(image)
    return images
