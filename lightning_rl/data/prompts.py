"""`PromptDataModule`: prompts (the columns rewards read, any images) from jsonl / parquet / HF `datasets` / built-in tasks.

Training draws an endless, resumable stream of prompt batches: a fresh seeded permutation per
pass over the data, sharded so each data-parallel rank gets different prompts (a group is then
always generated on one rank). Its position is saved in checkpoints (``state_dict``).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from typing import Any, Iterator, Literal

import torch
from lightning import LightningDataModule
from torch.utils.data import DataLoader, IterableDataset

from lightning_rl.core.batch import Prompts
from lightning_rl.core.models import load_tokenizer
from lightning_rl.core.vision import load_processor
from lightning_rl.data.checks import DataError, check_prompts, count_unknown_tokens
from lightning_rl.data.images import ImageColumn, encode_source
from lightning_rl.data.sources import check_columns, load_rows


def collate_prompts(rows: list[dict], pad_token_id: int, images: ImageColumn | None = None) -> dict[str, Any]:
    """``{"prompts": Prompts}``: token ids left-padded, the text and every other column kept as per-prompt lists, the images."""
    pictures = tensors = None
    if images is not None:
        encoded = [images.encode(r["prompt"], r[images.column]) for r in rows]
        rows = [
            {**{k: v for k, v in r.items() if k != images.column}, "input_ids": ids}
            for r, (ids, _, _) in zip(rows, encoded)
        ]
        tensors, pictures = [t for _, t, _ in encoded], [p for _, _, p in encoded]
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, width - n :] = torch.tensor(r["input_ids"], dtype=torch.long)
        mask[i, width - n :] = 1
    columns = {k: [r[k] for r in rows] for k in rows[0] if k != "input_ids"}
    return {"prompts": Prompts(ids, mask, columns, pictures, tensors)}


class PromptStream(IterableDataset):
    """Endless prompt batches for one rank; ``position`` = (pass over the data, batch within it)."""

    def __init__(
        self,
        rows,
        batch_size: int,
        pad_token_id: int,
        seed: int,
        shuffle: bool,
        rank: int,
        world_size: int,
        images: ImageColumn | None = None,
    ):
        n_per_rank = len(rows) // world_size
        if n_per_rank < batch_size:
            raise DataError(
                f"data.batch_size={batch_size} prompts per rank but only {len(rows)} training prompts for {world_size} rank(s); "
                "lower data.batch_size or add data"
            )
        self.rows, self.batch_size, self.pad_token_id = rows, batch_size, pad_token_id
        self.seed, self.shuffle, self.rank, self.world_size, self.images = seed, shuffle, rank, world_size, images
        self.batches_per_pass = n_per_rank // batch_size
        self.position = {"epoch": 0, "batch": 0}

    def _order(self, epoch: int) -> list[int]:
        n = len(self.rows)
        if not self.shuffle:
            order = list(range(n))
        else:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()
        return order[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            epoch, start = self.position["epoch"], self.position["batch"]
            order = self._order(epoch)
            for b in range(start, self.batches_per_pass):
                idx = order[b * self.batch_size : (b + 1) * self.batch_size]
                self.position = {"epoch": epoch, "batch": b + 1}
                yield collate_prompts([self.rows[i] for i in idx], self.pad_token_id, self.images)
            self.position = {"epoch": epoch + 1, "batch": 0}


class WithPretrainText(IterableDataset):
    """Prompt batches with a batch of pretraining text attached (``batch["ptx"]``), for PPO-ptx: two streams,
    each with its own resumable position."""

    def __init__(self, prompts: PromptStream, text: PromptStream):
        self.prompts, self.text = prompts, text

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch, text in zip(self.prompts, self.text):
            yield {**batch, "ptx": {"ids": text["prompts"].prompt_ids, "mask": text["prompts"].prompt_mask}}


class PromptDataModule(LightningDataModule):
    """Prompts for RL, tokenised once, with the columns rewards need passed through."""

    def __init__(
        self,
        train_data: str = "builtin:arithmetic",
        val_data: str | dict[str, str] | None = "builtin:arithmetic",
        split: str = "train",
        val_split: str = "test",
        columns: dict[str, str] | None = None,
        tokenizer: str | None = None,
        chat_template: bool = False,
        system_prompt: str | None = None,
        max_prompt_length: int = 256,
        overlong_prompt: Literal["error", "truncate", "drop"] = "error",
        bad_images: Literal["error", "skip"] = "error",
        max_image_pixels: int = 4096 * 4096,
        oversize_images: Literal["resize", "refuse"] = "resize",
        image_cache_mb: int = 1024,
        batch_size: int = 16,
        val_batch_size: int = 128,
        val_size: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        ptx_data: str | None = None,
        ptx_columns: list[str] | None = None,
        ptx_batch_size: int = 8,
        ptx_max_length: int = 256,
    ):
        """
        Args:
            train_data: ``builtin:arithmetic``, ``reasoning_gym:<task>`` (lightning_rl/data/reasoning_gym.py), a .jsonl/.json/.parquet/.csv file, a ``save_to_disk`` folder or a hub id.
            val_data: held-out prompts in the same forms (None = no validation), or several sets as a mapping
                ``{name: source}``, each logged under ``val/<name>/`` (e.g. ``{gsm8k: gsm8k.jsonl, math: math.jsonl}``).
            split: split of ``train_data`` to use (folders with several splits, hub datasets, built-in tasks).
            val_split: split of ``val_data``.
            columns: rename map {our name: dataset column}; ``prompt`` is required, every other column
                reaches the reward under its (renamed) name, e.g. ``{prompt: question, answer: gold}``. ``image``
                (default: a column named ``image``, if any) holds each prompt's image or list of images for a
                vision-language policy: paths relative to the data file, encoded bytes, PIL images or a `datasets`
                Image feature; the chat template places them before the prompt text.
            tokenizer: tokenizer path; linked to ``model.policy.path`` by the CLI.
            chat_template: wrap each prompt as a user turn with the tokenizer's chat template.
            system_prompt: optional system turn (with ``chat_template``).
            max_prompt_length: longest prompt in tokens.
            overlong_prompt: what to do with a longer prompt: error (say which row), truncate (keep the
                last ``max_prompt_length`` tokens; not for prompts with images) or drop the row.
            bad_images: a row whose image is missing, cannot be decoded, is not an 8-bit picture or is refused for
                its size: error (say which file, row and image) or skip the row (counted, with a warning).
            max_image_pixels: most pixels (width x height) of an image; a larger one is shrunk or refused
                (``oversize_images``); a 12000x12000 image took 2 GB and 13 s per batch to decode and process.
            oversize_images: resize (shrink to ``max_image_pixels``, aspect kept, counted with a warning) or refuse (a
                bad image: see ``bad_images``) an image larger than ``max_image_pixels``.
            image_cache_mb: decoded images kept in memory (least recently used dropped first), so an image is not
                decoded again for every batch; 0 keeps none.
            batch_size: prompts per RL iteration per data-parallel rank (samples = batch_size * group_size).
            val_batch_size: prompts per validation batch.
            val_size: use only the first ``val_size`` held-out prompts (None = all).
            seed: shuffling seed.
            shuffle: shuffle the training prompts every pass.
            ptx_data: pretraining text for PPO-ptx (`model.ptx`), in the same forms as ``train_data``; each
                iteration's batch carries ``ptx_batch_size`` rows of it (None = no second stream).
            ptx_columns: the columns whose text is joined into one document (default ``[text]``; for
                ``builtin:arithmetic``, ``[prompt, answer]`` gives solved problems).
            ptx_batch_size: text rows per iteration per rank.
            ptx_max_length: tokens kept per row (the first ones).
        """
        super().__init__()
        sizes = {
            "batch_size": batch_size,
            "val_batch_size": val_batch_size,
            "max_prompt_length": max_prompt_length,
            "val_size": val_size,
            "ptx_batch_size": ptx_batch_size,
            "ptx_max_length": ptx_max_length,
            "max_image_pixels": max_image_pixels,
        }
        for key, value in sizes.items():
            if value is not None and value < 1:
                raise ValueError(f"data.{key}={value} must be >= 1 (data.batch_size is prompts per iteration per rank)")
        if image_cache_mb < 0:
            raise ValueError(f"data.image_cache_mb={image_cache_mb} must be >= 0 (0 keeps no decoded image)")
        if isinstance(val_data, dict) and not val_data:
            raise ValueError(
                "data.val_data is an empty mapping: give {name: source} pairs, one source, or null for no validation"
            )
        self.save_hyperparameters()
        self.train_rows = self.val_rows = None
        self.val_names: list[str] | None = list(val_data) if isinstance(val_data, dict) else None
        """The validation sets' names, in dataloader order (None: one unnamed set, logged under ``val/``)."""
        self._stream: PromptStream | None = None
        self._ptx_stream: PromptStream | None = None
        self.ptx_rows = None
        self._restored_ptx_position: dict | None = None
        self.overlong_prompts: dict[str, int] = {}
        """Prompts longer than max_prompt_length per data source (truncated or dropped)."""
        self.unknown_tokens: dict[str, int] = {}
        """Prompt tokens the tokenizer does not know (its unknown token) per data source."""
        self.longest_prompt: int | None = None
        """Tokens in the longest prompt kept, over every source loaded."""
        self.bad_images: dict[str, int] = {}
        """Rows left out for a bad image per data source (``bad_images: skip``)."""
        self.image_columns: dict[str, ImageColumn] = {}  # of each data source that has images
        self._tok = None  # loaded when first needed (the CLI links data.tokenizer after construction)
        self._processor = None  # a vision-language policy's, loaded with the first image column
        self._restored_position: dict | None = None

    # ---- loading and tokenising -------------------------------------------------------------
    def _tokenizer(self):
        if self.hparams.tokenizer is None:
            raise ValueError(
                "data.tokenizer is not set: the CLI and lightning_rl.Trainer link it to model.policy.path; with a "
                "lightning.Trainer pass tokenizer=<model path>"
            )
        if self._tok is None:
            self._tok = load_tokenizer(self.hparams.tokenizer, "model.policy.path (the tokenizer of data.tokenizer)")
        return self._tok

    def _prepare(self, source: str, split: str, limit: int | None = None):
        rows = load_rows(source, split)
        mapping = dict(self.hparams.columns or {})
        mapping.setdefault("prompt", "prompt")
        if "image" not in mapping and "image" in rows.column_names:
            mapping["image"] = "image"
        check_columns(rows, mapping, source)
        rows = rows.rename_columns({theirs: ours for ours, theirs in mapping.items() if theirs != ours})
        if limit is not None:
            rows = rows.select(range(min(limit, len(rows))))
        tokenizer, hp = self._tokenizer(), self.hparams

        if hp.chat_template and not tokenizer.chat_template:
            raise ValueError(
                f"data.chat_template is true but the tokenizer of {hp.tokenizer!r} has no chat template; "
                "set data.chat_template: false (prompts are then tokenised as plain text) or use a chat model's tokenizer"
            )

        def tokenize(batch):
            texts = batch["prompt"]
            if hp.chat_template:
                system = [{"role": "system", "content": hp.system_prompt}] if hp.system_prompt else []
                ids = [
                    tokenizer.apply_chat_template(
                        system + [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True
                    )
                    for t in texts
                ]
                ids = [x["input_ids"] if isinstance(x, Mapping) else x for x in ids]
            else:
                ids = tokenizer(texts, add_special_tokens=True)["input_ids"]
            return {"input_ids": ids}

        check_prompts(rows["prompt"], source, mapping["prompt"])
        if "image" in mapping:
            rows = self._encode_images(rows, source, mapping["image"])
        else:
            rows = rows.map(tokenize, batched=True, desc=None)
        self.unknown_tokens[source] = count_unknown_tokens(
            tokenizer, rows["input_ids"], rows["prompt"], source, hp.tokenizer
        )
        lengths = [len(x) for x in rows["input_ids"]]
        too_long = [i for i, n in enumerate(lengths) if n > hp.max_prompt_length]
        if too_long:
            i = too_long[0]
            if hp.overlong_prompt == "error":
                raise ValueError(
                    f"{len(too_long)} prompt(s) in {source!r} are longer than data.max_prompt_length={hp.max_prompt_length} tokens "
                    f"(row {i} has {lengths[i]}: {rows[i]['prompt'][:80]!r}); raise data.max_prompt_length or set "
                    "data.overlong_prompt to truncate or drop"
                )
            if (
                hp.overlong_prompt == "truncate" and source in self.image_columns
            ):  # the cut could split an image's tokens
                raise ValueError(
                    f"{len(too_long)} prompt(s) with images in {source!r} are longer than data.max_prompt_length={hp.max_prompt_length} "
                    f"(row {i}: {lengths[i]} tokens) and cannot be truncated: raise data.max_prompt_length or set data.overlong_prompt: drop"
                )
            if hp.overlong_prompt == "drop":
                warnings.warn(
                    f"dropping {len(too_long)} prompt(s) longer than {hp.max_prompt_length} tokens from {source!r}"
                )
                rows = rows.select([j for j, n in enumerate(lengths) if n <= hp.max_prompt_length])
            else:
                warnings.warn(
                    f"truncating {len(too_long)} of {len(lengths)} prompt(s) in {source!r} to their last {hp.max_prompt_length} tokens (data.max_prompt_length)"
                )
                rows = rows.map(lambda r: {"input_ids": r["input_ids"][-hp.max_prompt_length :]})
            self.overlong_prompts[source] = len(too_long)
        if len(rows) == 0:
            raise ValueError(f"no prompts left in {source!r} (split {split!r})")
        self.longest_prompt = max(self.longest_prompt or 0, min(max(lengths), hp.max_prompt_length))
        return rows

    def _encode_images(self, rows, source: str, column: str):
        """Rows with images: each prompt through the policy's processor, bad images failing or skipped (``data.bad_images``)."""
        hp = self.hparams
        if not hp.chat_template:
            raise ValueError(
                f"{source!r} has an image column ({column!r}) but data.chat_template is false: the chat template places the images; "
                "set data.chat_template: true (and a vision-language model.policy)"
            )
        self._processor = self._processor or load_processor(
            hp.tokenizer, self._tokenizer(), "model.policy.path (the processor of data.tokenizer)"
        )
        rows, self.image_columns[source], bad = encode_source(
            rows,
            ImageColumn(
                self._processor,
                source,
                "image",
                hp.system_prompt,
                hp.max_image_pixels,
                hp.oversize_images,
                hp.image_cache_mb,
            ),
            hp.bad_images,
        )
        self.bad_images.update({source: bad} if bad else {})
        return rows

    def _prepare_text(self, source: str):
        """Pretraining text rows, tokenised (first ``ptx_max_length`` tokens) as ``input_ids``."""
        hp, tokenizer = self.hparams, self._tokenizer()
        rows = load_rows(source, hp.split)
        columns = list(hp.ptx_columns or ["text"])
        check_columns(rows, {c: c for c in columns}, source, "data.ptx_columns")

        def tokenize(batch):
            texts = ["".join(str(batch[c][i]) for c in columns) for i in range(len(batch[columns[0]]))]
            return {
                "input_ids": [
                    ids[: hp.ptx_max_length] for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]
                ]
            }

        rows = rows.map(tokenize, batched=True, desc=None)
        return rows.select_columns(["input_ids"])

    def setup(self, stage: str) -> None:
        import datasets

        datasets.disable_progress_bars()  # one bar per tokenisation pass is noise in a training log
        hp = self.hparams
        if stage == "fit" and self.train_rows is None:
            self.train_rows = self._prepare(hp.train_data, hp.split)
            if hp.ptx_data is not None:
                self.ptx_rows = self._prepare_text(hp.ptx_data)
        if stage in ("fit", "validate") and self.val_rows is None and hp.val_data is not None:
            sources = hp.val_data if isinstance(hp.val_data, dict) else {None: hp.val_data}
            self.val_rows = [self._prepare(source, hp.val_split, hp.val_size) for source in sources.values()]

    # ---- loaders ------------------------------------------------------------------------------
    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        hp = self.hparams
        self._stream = PromptStream(
            self.train_rows,
            hp.batch_size,
            self._tokenizer().pad_token_id,
            hp.seed,
            hp.shuffle,
            rank,
            world,
            self.image_columns.get(hp.train_data),
        )
        if self._restored_position is not None:
            self._stream.position = dict(self._restored_position)
        stream = self._stream
        if self.ptx_rows is not None:
            self._ptx_stream = PromptStream(
                self.ptx_rows, hp.ptx_batch_size, self._tokenizer().pad_token_id, hp.seed + 1, hp.shuffle, rank, world
            )
            if self._restored_ptx_position is not None:
                self._ptx_stream.position = dict(self._restored_ptx_position)
            stream = WithPretrainText(self._stream, self._ptx_stream)
        # batch_size=None: the stream yields whole batches; no workers, so its position is exact
        return DataLoader(stream, batch_size=None, num_workers=0)

    def val_dataloader(self) -> DataLoader | list:
        if self.val_rows is None:
            return []
        pad, hp = self._tokenizer().pad_token_id, self.hparams
        sources = list(hp.val_data.values()) if isinstance(hp.val_data, dict) else [hp.val_data]
        loaders = [
            DataLoader(
                rows,
                batch_size=hp.val_batch_size,
                shuffle=False,
                collate_fn=functools.partial(collate_prompts, pad_token_id=pad, images=self.image_columns.get(source)),
            )
            for rows, source in zip(self.val_rows, sources)
        ]
        return loaders if self.val_names else loaders[0]

    # ---- resumable position -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        position = self._stream.position if self._stream is not None else self._restored_position
        state = {"position": dict(position)} if position is not None else {}
        ptx_position = self._ptx_stream.position if self._ptx_stream is not None else self._restored_ptx_position
        if ptx_position is not None:
            state["ptx_position"] = dict(ptx_position)
        return state

    def rewind(self, state: dict[str, Any]) -> None:
        """Set the live streams back to positions taken with ``state_dict`` (an interrupted iteration's prompts
        and pretraining text are read again on resume, neither lost nor skipped)."""
        if self._stream is not None and "position" in state:
            self._stream.position = dict(state["position"])
        if self._ptx_stream is not None and "ptx_position" in state:
            self._ptx_stream.position = dict(state["ptx_position"])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "position" in state_dict:
            self._restored_position = dict(state_dict["position"])
        if "ptx_position" in state_dict:
            self._restored_ptx_position = dict(state_dict["ptx_position"])
