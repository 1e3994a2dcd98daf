"""Whether a teacher on a server reads the policy's token ids as the same tokens: the tokenizer it names compared with
the policy's (`tokenizer_mismatch`), or, when this machine cannot load that one, the server's ``/tokenize`` of a sample
of the policy's tokens, each token's text on its own.

Only the ids' meaning matters: the teacher scores the policy's ids and never reads text. A text that the server reads
as several tokens or none (its pre-tokenizer splits or drops it: the shipped teacher's tokenizer, loaded as Qwen2's,
drops a lone space) says nothing about the ids; a text it reads as one other id does.
"""

from __future__ import annotations

from components.rollout.server.engine import ScoringEngine
from components.rollout.server.http import ServerError
from lightning_rl.core.errors import ConfigError
from lightning_rl.core.models import load_tokenizer

from .base import tokenizer_mismatch


def check_served_tokenizer(student, engine: ScoringEngine, url: str, named: str | None, key: str) -> None:
    """Raise `ConfigError` with the reason when the teacher served at ``url`` reads ``student``'s ids otherwise.

    ``named``: the teacher's tokenizer as the config names it (``tokenizer``, or the checkpoint ``launch`` serves);
    None: the one the server names, when this machine can load it, else the server's ``/tokenize``."""
    path = named or engine.model_path(url)
    try:
        theirs = None if path is None else load_tokenizer(path, f"{key}.tokenizer")
    except (OSError, ValueError):
        if named is not None:  # named in the config: its error is the one to show
            raise
        theirs = None  # a path on the server's machine, or a hub id this one cannot reach
    if theirs is not None:
        reason, source = tokenizer_mismatch(student, theirs), path
    else:
        reason, source = _served_vocabulary(student, engine, url, path, key), f"{url}/tokenize"
    if reason is not None:
        raise ConfigError(
            f"{key}: the teacher's tokenizer ({source}) differs from the policy's: {reason}. The teacher scores the "
            "policy's token ids as they are: serve a teacher trained with the policy's tokenizer"
        )


def _served_vocabulary(student, engine: ScoringEngine, url: str, path: str | None, key: str) -> str | None:
    sample = vocabulary_sample(student)
    cannot = (
        f"{key}: cannot compare the teacher's tokenizer with the policy's: the server at {url} names no tokenizer this "
        f"machine can read ({path!r}) and its /tokenize"
    )
    fix = f"Set {key}.tokenizer to the teacher's tokenizer (a folder or hub id)"
    try:
        theirs = [engine.tokenize(url, text) for _, text in sample]
    except ServerError as err:
        raise ConfigError(f"{cannot} failed ({err}). {fix}") from None
    reason, read = served_vocabulary_mismatch(sample, theirs)
    if reason is None and read < len(sample) / 2:
        raise ConfigError(
            f"{cannot} reads only {read} of {len(sample)} of the policy's tokens as one token each. {fix}"
        )
    return reason


def vocabulary_sample(tokenizer, most: int = 128) -> list[tuple[int, str]]:
    """(id, text) of up to ``most`` tokens spread evenly over ``tokenizer``'s vocabulary, special tokens left out, each
    one whose text the tokenizer reads back as that one id."""
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(len(tokenizer)) if i not in special]
    texts = [(i, tokenizer.decode([i])) for i in ids[:: max(1, len(ids) // most)]]
    return [(i, text) for i, text in texts if tokenizer(text, add_special_tokens=False).input_ids == [i]]


def served_vocabulary_mismatch(sample: list[tuple[int, str]], theirs: list[list[int]]) -> tuple[str | None, int]:
    """Why a teacher that reads the text of each of the policy's ``sample`` tokens as ``theirs`` (its token ids of
    it) means another token by some id (None: it does not), and how many texts it read as one token: the ones that
    say something. A text it reads as several tokens or none (its pre-tokenizer splits or drops it) says nothing about
    the ids: the teacher scores ids, never text."""
    single = [(i, text, ids[0]) for (i, text), ids in zip(sample, theirs) if len(ids) == 1]
    differ = [(i, text, j) for i, text, j in single if i != j]
    if not differ:
        return None, len(single)
    i, text, j = differ[0]
    return (
        f"{len(differ)} of {len(single)} tokens of the policy's vocabulary it reads as another id (e.g. {text!r} is id "
        f"{i} to the policy, {j} to the teacher)",
        len(single),
    )
