"""Whether a server serves the policy's model, checked once its servers are connected and the policy is known, before
anything is sent to them: the architecture, the vocabulary and every weight a push sends (its name and shape in the
checkpoint the server loaded).

A server that serves another model takes requests in token ids it reads otherwise and fails the first push (an
HTTP 500 deep in its loader, or a load that leaves some of its tensors as they were). The engine says what it serves
(SGLang's ``/model_info``: the checkpoint and its architectures; vLLM's ``/v1/models``: the checkpoint); that
checkpoint's ``config.json`` and safetensors headers, read here when this machine can (a server launched here, a
shared file system), give its vocabulary and every tensor's name and shape. A checkpoint this machine cannot read is
compared by what the server reports (its architectures).
"""

from __future__ import annotations

import json
import struct
import warnings
from pathlib import Path
from typing import NamedTuple

from torch import nn

from lightning_rl.core.hf_attributes import architectures, model_config

from .buckets import plan_buckets


class Served(NamedTuple):
    """What a server says it serves: its checkpoint (a path or hub id, None: not said) and architectures."""

    path: str | None
    architectures: list[str] | None = None


def checkpoint_tensors(folder: Path) -> dict[str, tuple[int, ...]] | None:
    """{name: shape} of every tensor in ``folder``'s safetensors files (their headers only); None without any."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        shapes.update({name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"})
    return shapes


def served_mismatch(policy: nn.Module, served: Served) -> str | None:
    """Why the server that says ``served`` does not serve ``policy``'s model (None: nothing says so)."""
    config = model_config(policy)
    mine_arch = architectures(config)
    folder = Path(served.path) if served.path else None
    theirs: dict = {}
    if folder is not None and (folder / "config.json").is_file():
        theirs = json.loads((folder / "config.json").read_text())
    arch = served.architectures or theirs.get("architectures")
    if mine_arch and arch and list(arch) != mine_arch:
        return f"its architecture is {', '.join(arch)}, the policy's {', '.join(mine_arch)}"
    vocab, mine_vocab = _vocabulary(theirs), _vocabulary(config.to_dict() if config is not None else {})
    if vocab is not None and mine_vocab is not None and vocab != mine_vocab:
        return f"its vocabulary has {vocab} tokens, the policy's {mine_vocab}"
    tensors = checkpoint_tensors(folder) if folder is not None and folder.is_dir() else None
    if tensors is None:
        return None
    try:
        sent = {w.name: tuple(w.shape) for bucket in plan_buckets(policy, 2**62) for w in bucket}
    except ValueError:  # weights it cannot name or gather here (DeepSpeed ZeRO-3 partitions): a disk push saves them
        return None
    missing = [name for name in sent if name not in tensors]
    if missing:
        return (
            f"{len(missing)} of the {len(sent)} weights a push sends are not in its checkpoint (e.g. {missing[0]}; it "
            f"has {len(tensors)} tensors)"
        )
    differ = [name for name, shape in sent.items() if tensors[name] != shape]
    if differ:
        name = differ[0]
        return (
            f"{len(differ)} weights have another shape (e.g. {name}: {list(tensors[name])} there, "
            f"{list(sent[name])} in the policy)"
        )
    return None


def _vocabulary(config: dict) -> int | None:
    """The vocabulary size a config gives (a vision-language model's in its text config)."""
    if config.get("vocab_size") is not None:
        return int(config["vocab_size"])
    text = config.get("text_config") or {}
    return int(text["vocab_size"]) if text.get("vocab_size") is not None else None


def check_served(engine, url: str, policy: nn.Module, key: str) -> None:
    """Raise the engine's error, one line naming the server, the checkpoint it serves and the difference, when the
    server at ``url`` does not serve ``policy``'s model. A server that does not say what it serves (a router in front
    of the servers) is let through with a warning."""
    from .http import ServerError

    try:
        served = engine.served(url)
    except ServerError as err:
        warnings.warn(f"{key}: cannot check that the server at {url} serves the policy's model: {err}", stacklevel=2)
        return
    reason = served_mismatch(policy, served)
    if reason is not None:
        raise engine.client.fail(
            url,
            f" serves {served.path or 'a model'}, not the policy's: {reason}. Serve the policy's checkpoint (launch "
            f"serves it unless told otherwise), or set {key} to a server that does",
        )
