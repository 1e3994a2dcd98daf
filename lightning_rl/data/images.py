"""Image columns: a prompt's images read from its data row, checked, and turned into model inputs.

A row's image value is one image or a list of them (several images per prompt), each given as a path relative to the
data file (or absolute), raw encoded bytes, a PIL image (data built in Python), or a `datasets` ``Image`` feature; an
empty value is a text-only prompt. A bad image (a missing file, bytes PIL cannot decode, a 16-bit or float picture)
fails naming the data file, the row and the image, or, with ``data.bad_images: skip``, its row is left out and counted.
"""

from __future__ import annotations

import io
import os
import warnings
from typing import Any, Literal

import torch

from lightning_rl.core.vision import VisionProcessor
from lightning_rl.data.checks import DataError

CONVERTIBLE_MODES = {"1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV"}
"""8-bit modes a processor turns into RGB without losing the picture; 16-bit and float ones ("I;16", "I", "F") would be clipped."""


class BadImage(ValueError):
    """An image of a data row that cannot be used; the message says which and why."""


class ImageColumn:
    """The images of one data source: loads a row's image value, encodes its prompt with them (`VisionProcessor`)."""

    def __init__(self, processor: VisionProcessor, source: str, column: str, system_prompt: str | None = None):
        """``source``: the data file (relative paths are read from its folder) or name; ``column``: the data's column name."""
        self.processor, self.source, self.column, self.system_prompt = processor, source, column, system_prompt
        path = os.path.expanduser(source)
        self.folder = os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else os.getcwd()

    def images(self, value: Any) -> list:
        """The PIL images of one row's value (``[]`` for none), fully decoded; raises `BadImage`."""
        values = value if isinstance(value, (list, tuple)) else [] if value is None else [value]
        return [self._image(v, k, len(values)) for k, v in enumerate(values)]

    def encode(self, prompt: str, value: Any) -> tuple[list[int], dict[str, torch.Tensor], list]:
        """A row's prompt token ids, image tensors and images."""
        images = self.images(value)
        try:
            ids, tensors = self.processor.encode(prompt, images, self.system_prompt)
        except Exception as err:  # the processor's own checks (e.g. an image smaller than a patch) raise many types
            raise BadImage(
                f"its image(s) {', '.join(f'{im.width}x{im.height}' for im in images)} could not be processed ({type(err).__name__}: {err})"
            ) from err
        return ids, tensors, images

    def _image(self, value: Any, k: int, n: int):
        from PIL import Image, UnidentifiedImageError

        what = f"image {k + 1} of {n}" if n > 1 else "image"
        if isinstance(value, dict):  # a `datasets` Image feature, undecoded: {"bytes": ..., "path": ...}
            value = value.get("bytes") or value.get("path")
        if isinstance(value, Image.Image):
            image, what = value, f"{what} (a PIL image)"
        elif isinstance(value, (bytes, bytearray)):
            try:
                image = Image.open(io.BytesIO(value))
                image.load()
            except (UnidentifiedImageError, OSError, ValueError) as err:
                raise BadImage(f"{what} ({len(value)} bytes) cannot be decoded as an image ({err})") from None
        elif isinstance(value, str):
            path = os.path.join(self.folder, os.path.expanduser(value))
            what = f"{what} {value!r}"
            if not os.path.isfile(path):
                raise BadImage(
                    f"{what} does not exist (looked for {path}); paths are read relative to the data file's folder"
                )
            try:
                image = Image.open(path)
                image.load()
            except (UnidentifiedImageError, OSError, ValueError) as err:
                raise BadImage(f"{what} cannot be read as an image ({err})") from None
        else:
            raise BadImage(
                f"{what} is a {type(value).__name__}; give a path relative to the data file, encoded bytes or a PIL image"
            )
        if image.mode not in CONVERTIBLE_MODES:
            raise BadImage(
                f"{what} has mode {image.mode!r} (16-bit or float pixels, which RGB would clip); convert it to 8-bit RGB first"
            )
        if min(image.size) < 1:
            raise BadImage(f"{what} is empty ({image.width}x{image.height} pixels)")
        return image


def undecoded(rows, column: str):
    """``rows`` with a `datasets` Image column (or list of them) left undecoded, so that each row's image is decoded here
    (a corrupt one is then named with its row instead of failing the whole column)."""
    import datasets

    feature = rows.features[column]
    if isinstance(feature, datasets.Image):
        return rows.cast_column(column, datasets.Image(decode=False))
    if isinstance(feature, datasets.List) and isinstance(feature.feature, datasets.Image):
        return rows.cast_column(column, datasets.List(datasets.Image(decode=False)))
    return rows


def encode_source(rows, images: ImageColumn, on_bad: Literal["error", "skip"]):
    """``rows`` (a `datasets.Dataset` with ``prompt`` and ``images.column``) with each prompt's token ids (``input_ids``)
    encoded with its images, the rows with a bad image failing or (``on_bad="skip"``) left out; and the number left
    out. The images themselves are read again per batch (`collate_prompts`): their tensors are too large to keep."""
    from lightning_rl.data.checks import row_name

    rows = undecoded(rows, images.column)
    kept, ids, bad, first = [], [], 0, None
    for i, (prompt, value) in enumerate(zip(rows["prompt"], rows[images.column])):
        try:
            row_ids, _, _ = images.encode(prompt, value)
        except BadImage as err:
            if on_bad == "error":
                raise DataError(
                    f"{images.source}, {row_name(images.source, i)}: {err} (column {images.column!r}). Fix or remove the row, or set "
                    "data.bad_images: skip to leave rows with bad images out (they are counted)"
                ) from None
            bad, first = bad + 1, first or f"{row_name(images.source, i)}: {err}"
            continue
        kept.append(i)
        ids.append(row_ids)
    if bad:
        warnings.warn(
            f"skipping {bad} of {len(rows)} row(s) of {images.source!r} with a bad image (data.bad_images: skip), e.g. {first}"
        )
    if not kept:
        raise DataError(f"no prompts left in {images.source!r}: every row has a bad image, e.g. {first}")
    return rows.select(kept).add_column("input_ids", ids), images, bad
