"""JSON written outside the trainer (an agent's request, a model's tool call), parsed so that no text raises anything but
`ValueError`, and no value it yields can raise later.

Python's parser recurses once per level of nesting and raises `RecursionError` past the interpreter's limit (a body
nested 100,000 deep; under a raised limit, a stack overflow that ends the process), and what later walks the value
recurses too, shallower: ``json.dumps``, a chat template's ``tojson``, ``==`` (a ``tools`` list nested 800 deep ended a
round). So the nesting is measured on the text first, without recursion, and past `MAX_DEPTH` the text is refused
before it is parsed. Numbers no float holds are refused as well: ``1e999`` parses as ``inf`` and the ``NaN`` /
``Infinity`` literals (outside the JSON standard, which Python's parser accepts) as themselves, and ``int()`` of them
raises `OverflowError` / `ValueError` far from the text that sent them (``"n": 1e999`` ended a run).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from array import array
from typing import Any

MAX_DEPTH = 64
"""Most levels of arrays and objects in one text: an OpenAI request nests about 7 deep before a tool's JSON schema or a
call's arguments begin, and a schema rarely passes 20; the code that walks a value (json.dumps, a chat template) has
thousands of levels of stack left at this depth."""

# a string, or an unterminated one to the end (which then never makes the pattern backtrack)
_STRING = re.compile(r'"[^"\\]*(?:\\[\s\S]?[^"\\]*)*(?:"|\Z)')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 and -1 as signed bytes
_CHUNK = 1 << 16


def nests_deeper_than(text: str, max_depth: int) -> bool:
    """Whether ``text``'s arrays and objects nest more than ``max_depth`` deep (brackets inside strings do not count),
    measured without recursion, in time linear in the text. A text with no more opening brackets than ``max_depth``
    (most requests) is not measured at all."""
    if text.count("[") + text.count("{") <= max_depth:
        return False
    return _deeper(_STRING.sub("", text).encode("utf-8", "surrogatepass"), max_depth)


def _deeper(text: bytes, max_depth: int) -> bool:
    """Whether the running count of opening less closing brackets in ``text`` passes ``max_depth``: as deep as a parser
    recurses (one that meets a close that does not pair with its open stops there, no deeper)."""
    steps, depth = text.translate(_STEPS, _NOT_BRACKETS), 0
    for start in range(0, len(steps), _CHUNK):  # a text nested too deep stops at its first chunk past the bound
        running = list(itertools.accumulate(array("b", steps[start : start + _CHUNK]), initial=depth))
        if max(running) > max_depth:
            return True
        depth = running[-1]
    return False


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is too large for a float")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def loads(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(text)``, refusing (`ValueError`, its message saying why) text nested past ``max_depth`` and numbers no
    float holds. ``bytes`` are decoded as ``json.loads`` decodes them (UTF-8, or UTF-16/32 by their first bytes)."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode(json.detect_encoding(text), "surrogatepass")
    if nests_deeper_than(text, max_depth):
        raise ValueError(f"it nests arrays and objects more than {max_depth} deep")
    return json.loads(text, parse_float=_finite, parse_constant=_no_constant)
