"""docs/reference.md's metrics tables hold every tag lightning_rl writes: each run of the test suite is checked against
them after its test (tests/support/metric_tags.py, from tests/conftest.py); here, how a tag matches a row, and every
tag the code spells out as a string in a namespace the tables know."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.metric_tags import check_run_folders, documented, is_documented

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "tag, listed",
    [
        ("reward/mean", True),
        ("reward/accuracy", True),  # a Composite's part: reward/<part>
        ("reward/ExactMatch_2", True),
        ("reward/new_frac", False),  # a metric, not a part's name: it needs its row
        ("val/gsm8k/pass@4", True),
        ("val/pass@16", True),
        ("samples/3", True),
        ("histogram/advantage", True),
        ("kl/ref", True),
        ("kl/refs", False),
        ("moe/not_a_metric", False),
    ],
)
def test_a_tag_matches_a_row_or_a_rows_name_pattern(tag, listed):
    assert is_documented(tag) == listed


def _string_tags(folder: str) -> set[tuple[str, str]]:
    """(tag, file) for every string constant ``<namespace>/<name>`` under ``folder`` whose namespace the tables use."""
    namespaces = {tag.split("/")[0] for tag, _ in documented() if "/" in tag}
    found = set()
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                namespace, _, name = node.value.partition("/")
                if namespace in namespaces and name and name.replace("_", "").replace("@", "").isalnum():
                    found.add((node.value, str(path.relative_to(ROOT))))
    return found


def test_every_tag_the_code_spells_out_has_a_row():
    missing = sorted(
        (tag, file) for tag, file in _string_tags("lightning_rl") | _string_tags("components") if not is_documented(tag)
    )
    assert not missing, f"tags in the code without a row in docs/reference.md's metrics tables: {missing}"


def test_a_run_that_logs_an_unlisted_tag_fails_naming_it(tmp_path_factory):
    from torch.utils.tensorboard import SummaryWriter

    folder = tmp_path_factory.mktemp("unlisted")  # not this test's tmp_path, which the conftest checks after it
    with SummaryWriter(str(folder / "run")) as writer:
        writer.add_scalar("reward/mean", 0.5, 0)
        writer.add_scalar("moe/not_a_metric", 1.0, 0)
        writer.add_text("samples", "| a |\n|---|\n| b |", 0)
    with pytest.raises(AssertionError, match=r"do not list: \['moe/not_a_metric'\]; give each a row there"):
        check_run_folders(folder)
