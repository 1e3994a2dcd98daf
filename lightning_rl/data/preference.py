"""Preference pairs for reward-model training: (prompt, chosen, rejected) rows, tokenised and batched.

Sources: jsonl / parquet / csv files, ``save_to_disk`` folders and hub datasets (columns renamed
with ``columns``), or ``builtin:arithmetic`` (the RL task's problems, correct answer against a
wrong one, with the same train / test split). Each side is prompt + response (+ EOS), the way a
sampled response ends, so the reward model is trained on the token it is read at in RL.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Mapping

import torch
from lightning import LightningDataModule
from torch.utils.data import DataLoader

from lightning_rl.core.models import load_tokenizer
from lightning_rl.data.sources import check_columns, load_rows
from lightning_rl.data.tasks import arithmetic_rows


def arithmetic_pairs(split: str = "train", seed: int = 0, max_operand: int = 99, operators: str = "+") -> list[dict]:
    """builtin:arithmetic as preference pairs: the correct answer against one wrong answer per problem.

    Wrong answers mimic a weak policy's mistakes: off by a little (+-1..10), one digit changed,
    dropped or duplicated, or any number. The split is the RL task's, so held-out prompts stay held out.
    """
    rng = random.Random(seed)
    pairs = []
    for row in arithmetic_rows(split, max_operand, operators):
        answer = int(row["answer"])
        wrong = answer
        while wrong == answer:
            wrong = _mistake(answer, rng, 2 * max_operand if "*" not in operators else max_operand**2)
        pairs.append({"prompt": row["prompt"], "chosen": row["answer"], "rejected": str(wrong)})
    return pairs


def _mistake(answer: int, rng: random.Random, largest: int) -> int:
    digits = list(str(abs(answer)))
    kind = rng.choice(["near", "near", "near", "digit", "drop", "repeat", "any"])
    if kind == "near":
        return answer + rng.choice([-1, 1]) * rng.randint(1, 10)
    if kind == "any":
        return rng.randint(0, largest)
    i = rng.randrange(len(digits))
    if kind == "digit":
        digits[i] = rng.choice([d for d in "0123456789" if d != digits[i]])
    elif kind == "drop" and len(digits) > 1:
        del digits[i]
    else:
        digits.insert(i, digits[i])
    return int("".join(digits)) * (-1 if answer < 0 else 1)


PAIR_TASKS = {"arithmetic": arithmetic_pairs}


class PairDataModule(LightningDataModule):
    """Preference pairs (prompt, chosen, rejected) from jsonl / parquet / csv, a ``save_to_disk`` folder, a hub
    dataset or ``builtin:arithmetic``, tokenised with the reward model's tokenizer."""

    def __init__(
        self,
        train_data: str = "builtin:arithmetic",
        val_data: str | None = "builtin:arithmetic",
        split: str = "train",
        val_split: str = "test",
        columns: dict[str, str] | None = None,
        tokenizer: str | None = None,
        chat_template: bool = False,
        system_prompt: str | None = None,
        append_eos: bool = True,
        max_length: int = 1024,
        batch_size: int = 32,
        val_batch_size: int = 128,
        val_size: int | None = None,
        seed: int = 0,
    ):
        """
        Args:
            train_data: pairs: ``builtin:arithmetic``, a .jsonl/.json/.parquet/.csv file, a ``save_to_disk`` folder or a hub id.
            val_data: held-out pairs in the same forms (None = no validation).
            split: split of ``train_data``.
            val_split: split of ``val_data``.
            columns: rename map {our name: dataset column} for ``prompt``, ``chosen`` and ``rejected``.
            tokenizer: tokenizer path; linked to ``model.path`` by the CLI.
            chat_template: wrap each prompt as a user turn with the tokenizer's chat template (as the RL data does).
            system_prompt: optional system turn (with ``chat_template``).
            append_eos: end every response with EOS, as sampled responses end (RL reads the score there).
            max_length: pairs whose longer side exceeds this many tokens are dropped (with a warning).
            batch_size: pairs per training step.
            val_batch_size: pairs per validation step.
            val_size: use only the first ``val_size`` held-out pairs (None = all).
            seed: shuffling seed (and the seed of ``builtin`` pairs).
        """
        super().__init__()
        self.save_hyperparameters()
        self.train_rows = self.val_rows = None
        self._tok = None  # loaded when first needed

    def _tokenizer(self):
        if self.hparams.tokenizer is None:
            raise ValueError(
                "data.tokenizer is not set: the CLI links it to model.path; in Python pass tokenizer=<model path>"
            )
        if self._tok is None:
            self._tok = load_tokenizer(self.hparams.tokenizer, "data.tokenizer")
        return self._tok

    def _read(self, source: str, split: str, seed: int) -> list[dict]:
        if source.startswith("builtin:"):
            name = source.split(":", 1)[1]
            if name not in PAIR_TASKS:
                raise ValueError(
                    f"unknown built-in pair task {source!r}; available: {[f'builtin:{k}' for k in PAIR_TASKS]}"
                )
            return PAIR_TASKS[name](split, seed=seed)
        rows = load_rows(source, split)
        mapping = {"prompt": "prompt", "chosen": "chosen", "rejected": "rejected", **(self.hparams.columns or {})}
        check_columns(rows, mapping, source)
        return [{ours: row[theirs] for ours, theirs in mapping.items()} for row in rows]

    def _encode(self, rows: list[dict], source: str) -> list[dict]:
        tok, hp = self._tokenizer(), self.hparams
        eos = [tok.eos_token_id] if hp.append_eos else []
        encoded = []
        for row in rows:
            if hp.chat_template:
                system = [{"role": "system", "content": hp.system_prompt}] if hp.system_prompt else []
                prompt = tok.apply_chat_template(
                    system + [{"role": "user", "content": row["prompt"]}], add_generation_prompt=True, tokenize=True
                )
                prompt = list(prompt["input_ids"] if isinstance(prompt, Mapping) else prompt)
            else:
                prompt = tok(row["prompt"], add_special_tokens=True)["input_ids"]
            chosen, rejected = (
                prompt + tok(row[k], add_special_tokens=False)["input_ids"] + eos for k in ("chosen", "rejected")
            )
            if max(len(chosen), len(rejected)) <= hp.max_length:
                encoded.append({"chosen": chosen, "rejected": rejected})
        if len(encoded) < len(rows):
            warnings.warn(
                f"dropped {len(rows) - len(encoded)} pair(s) of {source!r} longer than data.max_length={hp.max_length} tokens"
            )
        if not encoded:
            raise ValueError(f"no preference pairs left in {source!r}")
        return encoded

    def setup(self, stage: str) -> None:
        hp = self.hparams
        if stage == "fit" and self.train_rows is None:
            self.train_rows = self._encode(self._read(hp.train_data, hp.split, hp.seed), hp.train_data)
        if stage in ("fit", "validate") and self.val_rows is None and hp.val_data is not None:
            rows = self._read(hp.val_data, hp.val_split, hp.seed + 1)
            self.val_rows = self._encode(rows[: hp.val_size], hp.val_data)

    def _collate(self, pairs: list[dict]) -> dict[str, torch.Tensor]:
        """Right-padded (2N, S): the N chosen sequences, then the N rejected ones."""
        seqs = [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs]
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), self._tokenizer().pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
        return {"input_ids": ids, "attention_mask": mask}

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(self.hparams.seed)
        return DataLoader(
            self.train_rows,
            batch_size=self.hparams.batch_size,
            shuffle=True,
            generator=generator,
            collate_fn=self._collate,
            drop_last=True,
        )

    def val_dataloader(self) -> DataLoader | list:
        if self.val_rows is None:
            return []
        return DataLoader(
            self.val_rows, batch_size=self.hparams.val_batch_size, shuffle=False, collate_fn=self._collate
        )
