"""Reading a JSON request body field by field: each read names the field (dotted, as the SDK's request model names it)
in the `BadRequest` it raises, so a client learns which value to change."""

from __future__ import annotations

import math
from typing import Any

from lightning_rl.service.errors import BadRequest

MISSING = object()


class Fields:
    """A JSON object being read; ``where`` is its dotted path in the request (empty at the top)."""

    def __init__(self, body: Any, where: str = ""):
        if not isinstance(body, dict):
            raise BadRequest(f"{where or 'the body'} must be a JSON object, got {type(body).__name__}", where or None)
        self.body, self.where = body, where

    def name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def raw(self, key: str, default: Any = MISSING) -> Any:
        value = self.body.get(key, MISSING)
        if value is MISSING or value is None:
            if default is MISSING:
                raise BadRequest(f"{self.name(key)} is required", self.name(key))
            return default
        return value

    def text(self, key: str, default: Any = MISSING, max_length: int = 4096) -> str:
        value = self.raw(key, default)
        if value is default and default is not MISSING:
            return value
        if not isinstance(value, str) or len(value) > max_length:
            raise BadRequest(f"{self.name(key)} must be a string of at most {max_length} characters", self.name(key))
        return value

    def integer(self, key: str, default: Any = MISSING, low: int | None = None, high: int | None = None) -> int:
        value = self.raw(key, default)
        if value is default and default is not MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequest(f"{self.name(key)} must be an integer, got {value!r}", self.name(key))
        _in_range(self.name(key), value, low, high)
        return value

    def number(self, key: str, default: Any = MISSING, low: float | None = None, high: float | None = None) -> float:
        value = self.raw(key, default)
        if value is default and default is not MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise BadRequest(f"{self.name(key)} must be a finite number, got {value!r}", self.name(key))
        _in_range(self.name(key), float(value), low, high)
        return float(value)

    def flag(self, key: str, default: Any = MISSING) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise BadRequest(f"{self.name(key)} must be true or false, got {value!r}", self.name(key))
        return value

    def object(self, key: str, default: Any = MISSING) -> "Fields | None":
        value = self.raw(key, default)
        if value is default and default is not MISSING:
            return value
        return Fields(value, self.name(key))

    def tokens(self, key: str, vocab_size: int, max_tokens: int) -> list[int]:
        """A ``ModelInput`` (``{"chunks": [{"type": "encoded_text", "tokens": [...]}, ...]}``) as its token ids."""
        model_input = self.object(key)
        chunks = model_input.raw("chunks")
        if not isinstance(chunks, list):
            raise BadRequest(f"{model_input.name('chunks')} must be a list", model_input.name("chunks"))
        ids: list[int] = []
        for i, chunk in enumerate(chunks):
            chunk = Fields(chunk, f"{model_input.name('chunks')}[{i}]")
            kind = chunk.text("type", "encoded_text")
            if kind != "encoded_text":
                raise BadRequest(
                    f"{chunk.where} is an {kind} chunk; this service takes token chunks (encoded_text) only",
                    chunk.where,
                )
            values = chunk.raw("tokens")
            if not isinstance(values, list) or len(ids) + len(values) > max_tokens:
                raise BadRequest(
                    f"{chunk.name('tokens')} must be a list; at most {max_tokens} tokens in all", chunk.where
                )
            for token in values:
                if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
                    raise BadRequest(
                        f"{chunk.name('tokens')} holds {token!r}, not a token id of the model (0 .. {vocab_size - 1})",
                        chunk.name("tokens"),
                    )
            ids.extend(values)
        if not ids:
            raise BadRequest(f"{model_input.where} holds no tokens", model_input.where)
        return ids


def _in_range(name: str, value: float, low: float | None, high: float | None) -> None:
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"{'-inf' if low is None else low} .. {'inf' if high is None else high}"
        raise BadRequest(f"{name} must be in {bounds}, got {value}", name)
