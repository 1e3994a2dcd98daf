"""The tags a run writes against the metrics tables of docs/reference.md: every tag a run of the test suite logs
(scalars, histograms, images, text) must match a row's tag there. Adding a row for a new tag is all a new tag needs.

A row's first cell lists its tags in backticks. ``<...>`` in a tag stands for a name (``reward/<part>``,
``val/<set>/reward``, ``val/pass@<k>``); a name that ends like a metric (``_frac``, ``_mean``, ``_max``, ``_min``,
``_std``, ``_s``) is not taken as such a name, so ``reward/<part>`` does not stand in for a new ``reward/*_frac``.
`check_run_folders` is called after every test (tests/conftest.py) on the event files under its ``tmp_path``.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"
NOT_OURS = {
    "hp_metric": "Lightning's TensorBoardLogger placeholder (default_hp_metric; our configs turn it off)",
    "custom_scalars__config__": "TensorBoard's layout of the Custom Scalars tab",
}
METRIC_ENDING = re.compile(r"_(frac|mean|max|min|std|s)$")


@lru_cache(maxsize=1)
def documented() -> tuple[tuple[str, re.Pattern], ...]:
    """(tag as written, its pattern) for every tag in the first cell of the rows of the tables under ``## Metrics``."""
    text = REFERENCE.read_text()
    section = text[text.index("## Metrics") :]
    following = section.find("\n## ", 1)
    section = section if following < 0 else section[:following]
    tags = []
    for line in section.splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        first = line.split("|")[1]
        for tag in re.findall(r"`([^`]+)`", first):
            parts = re.split(r"(<[^>]+>)", tag)
            regex = "".join(
                r"(?P<name%d>[\w.@-]+)" % i if p.startswith("<") else re.escape(p) for i, p in enumerate(parts)
            )
            tags.append((tag, re.compile(regex)))
    return tuple(tags)


def is_documented(tag: str) -> bool:
    for _, pattern in documented():
        found = pattern.fullmatch(tag)
        if found and not any(METRIC_ENDING.search(name) for name in found.groupdict().values()):
            return True
    return False


def logged_tags(folder: Path) -> set[str]:
    """Every tag in the TensorBoard event files under ``folder``: scalars, histograms, images, text (by the name it was
    written under: ``samples``, not TensorBoard's ``samples/text_summary``)."""
    runs = sorted({events.parent for events in folder.rglob("events.out.tfevents.*")})
    if not runs:
        return set()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for run in runs:
        accumulator = EventAccumulator(
            str(run), size_guidance={"scalars": 1, "histograms": 1, "images": 1, "tensors": 1}
        )
        accumulator.Reload()
        kinds = accumulator.Tags()
        tags |= {*kinds["scalars"], *kinds["histograms"], *kinds["images"]}
        tags |= {tag.removesuffix("/text_summary") for tag in kinds["tensors"]}
    return tags - set(NOT_OURS)


def undocumented(tags: set[str]) -> list[str]:
    return sorted(tag for tag in tags if not is_documented(tag))


def check_run_folders(folder: Path) -> None:
    """Fail naming every tag the runs under ``folder`` logged that docs/reference.md does not list."""
    missing = undocumented(logged_tags(folder))
    if missing:
        raise AssertionError(
            f"this test's runs logged tags that docs/reference.md's metrics tables do not list: {missing}; give each a "
            "row there (its tag in backticks in the first cell, and what it is)"
        )
