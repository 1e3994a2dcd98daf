"""Image columns: a prompt's images read from its data row, checked, and turned into model inputs.

A row's image value is one image or a list of them (several images per prompt), each given as a path relative to the
data file (or absolute), raw encoded bytes, a PIL image (data built in Python), or a `datasets` ``Image`` feature; an
empty value is a text-only prompt. A bad image (a missing file, bytes PIL cannot decode, a 16-bit or float picture,
one larger than ``data.max_image_pixels`` with ``data.oversize_images: refuse``) fails naming the data file, the row
and the image, or, with ``data.bad_images: skip``, its row is left out and counted. A larger image is otherwise
shrunk to fit (its aspect kept; a JPEG is decoded at a fraction of its size): a 12000x12000 picture took 2 GB and
13 s to decode. Decoded images are kept (least recently used first out, up to ``data.image_cache_mb``), so a row's
image is not decoded again for every batch that holds it.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import threading
import warnings
from collections import OrderedDict
from typing import Any, Literal

import torch

from lightning_rl.core.vision import VisionProcessor
from lightning_rl.data.checks import DataError

CONVERTIBLE_MODES = {"1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV"}
"""8-bit modes a processor turns into RGB without losing the picture; 16-bit and float ones ("I;16", "I", "F") would be clipped."""


class BadImage(ValueError):
    """An image of a data row that cannot be used; the message says which and why."""


class DecodedImages:
    """Decoded images by key, the least recently used dropped past ``max_bytes`` of pixels; safe across threads."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes, self.decoded = max_bytes, 0, 0
        self._images: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, decode):
        """The image under ``key``, or ``decode()``'s (kept when it fits)."""
        with self._lock:
            if key in self._images:
                self._images.move_to_end(key)
                return self._images[key]
        image = decode()
        size = _pixel_bytes(image)
        with self._lock:
            self.decoded += 1
            if key not in self._images and size <= self.max_bytes:
                self._images[key], self.bytes = image, self.bytes + size
                while self.bytes > self.max_bytes:
                    self.bytes -= _pixel_bytes(self._images.popitem(last=False)[1])
        return image


def _least_factor(size: tuple[int, int], max_pixels: int) -> int:
    """The least whole factor that takes an image of ``size`` to ``max_pixels`` or fewer (sides rounded up, as PIL's
    ``reduce`` does)."""
    width, height = size
    factor = max(1, math.ceil(math.sqrt(width * height / max_pixels)))
    while -(-width // factor) * -(-height // factor) > max_pixels:
        factor += 1
    return factor


def _pixel_bytes(image) -> int:
    return image.width * image.height * len(image.getbands())


class ImageColumn:
    """The images of one data source: loads a row's image value, encodes its prompt with them (`VisionProcessor`)."""

    def __init__(
        self,
        processor: VisionProcessor,
        source: str,
        column: str,
        system_prompt: str | None = None,
        max_pixels: int = 4096 * 4096,
        oversize: Literal["resize", "refuse"] = "resize",
        cache_mb: int = 1024,
    ):
        """``source``: the data file (relative paths are read from its folder) or name; ``column``: the data's column name;
        ``max_pixels``, ``oversize``, ``cache_mb``: ``data.max_image_pixels``, ``data.oversize_images``,
        ``data.image_cache_mb``."""
        self.processor, self.source, self.column, self.system_prompt = processor, source, column, system_prompt
        self.max_pixels, self.oversize, self.cache = max_pixels, oversize, DecodedImages(cache_mb << 20)
        self.resized = 0
        """Images shrunk to ``max_pixels`` (counted where decoded)."""
        path = os.path.expanduser(source)
        self.folder = os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else os.getcwd()

    def images(self, value: Any) -> list:
        """The PIL images of one row's value (``[]`` for none), fully decoded; raises `BadImage`."""
        values = value if isinstance(value, (list, tuple)) else [] if value is None else [value]
        return [self._cached(v, k, len(values)) for k, v in enumerate(values)]

    def _cached(self, value: Any, k: int, n: int):
        if isinstance(value, dict):  # a `datasets` Image feature, undecoded: {"bytes": ..., "path": ...}
            value = value.get("bytes") or value.get("path")
        if isinstance(value, (bytes, bytearray)):
            key = hashlib.blake2b(value, digest_size=16).digest()
        elif isinstance(value, str):
            path = os.path.join(self.folder, os.path.expanduser(value))
            try:
                stat = os.stat(path)
            except OSError:
                return self._image(value, k, n)  # names what is missing
            key = (path, stat.st_mtime_ns, stat.st_size)  # a file rewritten in place is decoded again
        else:  # a PIL image already in memory
            return self._image(value, k, n)
        return self.cache.get(key, lambda: self._image(value, k, n))

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
        from PIL import Image

        what = f"image {k + 1} of {n}" if n > 1 else "image"
        if isinstance(value, Image.Image):
            what = f"{what} (a PIL image)"
            image = self._fitted(value, what, fresh=False)
        elif isinstance(value, (bytes, bytearray)):
            image = self._decoded(io.BytesIO(value), f"{what} ({len(value)} bytes)", "decoded")
        elif isinstance(value, str):
            path = os.path.join(self.folder, os.path.expanduser(value))
            what = f"{what} {value!r}"
            if not os.path.isfile(path):
                raise BadImage(
                    f"{what} does not exist (looked for {path}); paths are read relative to the data file's folder"
                )
            image = self._decoded(path, what, "read")
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

    def _decoded(self, file, what: str, verb: str):
        """The image in ``file`` (a path or a buffer), its header read first: one past ``max_pixels`` is refused before
        it is decoded, or decoded shrunk."""
        from PIL import Image, UnidentifiedImageError

        try:
            with warnings.catch_warnings():  # PIL warns past 89M pixels; the size is judged here
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                image = Image.open(file)
            image = self._fitted(image, what, fresh=True)
            image.load()
        except BadImage:
            raise
        except Image.DecompressionBombError as err:  # past twice PIL's own limit: it refuses to read the header on
            raise BadImage(
                f"{what} is larger than PIL decodes ({err}); data.max_image_pixels={self.max_pixels}"
            ) from None
        except (UnidentifiedImageError, OSError, ValueError) as err:
            raise BadImage(f"{what} cannot be {verb} as an image ({err})") from None
        return image

    def _fitted(self, image, what: str, fresh: bool):
        """``image``, or a new one reduced by the least whole factor that fits ``max_pixels`` (``fresh``: just opened, not
        decoded yet: a JPEG is then decoded at 1/2, 1/4 or 1/8 of its size directly)."""
        pixels = image.width * image.height
        if pixels <= self.max_pixels:
            return image
        if self.oversize == "refuse":
            raise BadImage(
                f"{what} is {image.width}x{image.height} = {pixels} pixels, more than data.max_image_pixels="
                f"{self.max_pixels}; shrink it, raise the limit, or set data.oversize_images: resize"
            )
        if fresh and image.format == "JPEG":
            factor = _least_factor(image.size, self.max_pixels)
            image.draft(image.mode, (-(-image.width // factor), -(-image.height // factor)))
        factor = _least_factor(image.size, self.max_pixels)  # what the draft left (1 where it fits)
        image = image.reduce(factor) if factor > 1 else image  # a box filter over factor x factor pixels: a new image
        self.resized += 1  # read after the data loads, on one thread
        return image
        if self.oversize == "refuse":
            raise BadImage(
                f"{what} is {image.width}x{image.height} = {pixels} pixels, more than data.max_image_pixels="
                f"{self.max_pixels}; shrink it, raise the limit, or set data.oversize_images: resize"
            )
        scale = math.sqrt(self.max_pixels / pixels)
        box = (max(1, math.floor(image.width * scale)), max(1, math.floor(image.height * scale)))
        image = image if fresh else image.copy()  # never the caller's own object
        image.thumbnail(box)  # a JPEG is decoded at 1/2, 1/4 or 1/8 of its size (draft) before the resampling
        self.resized += 1  # read after the data loads, on one thread
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
        out. The processor's tensors are computed again per batch (`collate_prompts`): they are too large to keep; the decoded
    images come from ``images``'s cache while it holds them."""
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
    if images.resized:
        warnings.warn(
            f"{images.resized} image(s) of {images.source!r} larger than data.max_image_pixels={images.max_pixels} were "
            "shrunk to fit (data.oversize_images: resize)"
        )
    if not kept:
        raise DataError(f"no prompts left in {images.source!r}: every row has a bad image, e.g. {first}")
    return rows.select(kept).add_column("input_ids", ids), images, bad
