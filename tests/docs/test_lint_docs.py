"""scripts/lint_docs.py, the documentation's lint `make docs` runs before the strict build: a table without its header
row and an absolute machine path fail it, naming file and line; the repository's own pages pass."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("lint_docs", ROOT / "scripts" / "lint_docs.py")
lint_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lint_docs)

HEADED = "| variant | median |\n|---|---:|\n| GRPO | 32 |\n| distillation | 4 |\n"


def _lint(tmp_path, text: str, name: str = "page.md") -> list[str]:
    page = tmp_path / name
    page.write_text(text)
    return lint_docs.lint(page)


def test_a_table_with_its_header_row_passes(tmp_path):
    assert _lint(tmp_path, f"Three seeds:\n\n{HEADED}\nAfter.\n") == []
    # a pipe inside code or escaped is no cell separator
    assert _lint(tmp_path, "| option | what |\n|---|---|\n| `a | b` | x \\| y |\n") == []


def test_a_table_that_starts_with_its_delimiter_row_fails_naming_the_line(tmp_path):
    # docs/performance.md's distillation table, before the fix
    text = "Three seeds:\n\n|---|---|\n| GRPO | 32 |\n| distillation | 4 |\n"
    (problem,) = _lint(tmp_path, text)
    assert problem.endswith("page.md:3: a table without a header row: its first line is the delimiter row (|---|)")


def test_rows_without_a_delimiter_row_and_a_header_of_other_width_fail(tmp_path):
    (problem,) = _lint(tmp_path, "| GRPO | 32 |\n| distillation | 4 |\n")
    assert problem.endswith("page.md:1: a table without a header row: no delimiter row (|---|) under its first line")
    (problem,) = _lint(tmp_path, "| variant |\n|---|---|\n| GRPO | 32 |\n")
    assert problem.endswith("page.md:1: the header row has 1 cells and the delimiter row 2")


def test_tables_in_fenced_code_are_text(tmp_path):
    assert _lint(tmp_path, "```text\n|---|---|\n| printed | by a command |\n```\n") == []


@pytest.mark.parametrize(
    "path",
    ["/home/ada/lightning_rl/runs", "/work/main/runs/grpo/version_3", "/tmp/run", "/Users/ada/x", "/root/.cache/x"],
)
def test_an_absolute_machine_path_fails_in_text_code_and_console_pictures(tmp_path, path):
    named = "/".join(path.split("/")[:3])  # the folder and its first name: /home/ada
    (problem,) = _lint(tmp_path, f"The run wrote\n\n```text\ncheckpoint: {path}/last.ckpt\n```\n")
    assert problem.endswith(
        f"page.md:4: an absolute machine path: {named} (name it from the repository root, ~/ or a variable)"
    )
    # rich's SVG writes spaces as &#160;
    (problem,) = _lint(tmp_path, f"<text>checkpoint:&#160;{path}/last.ckpt</text>\n", name="console.svg")
    assert problem.endswith(
        f"console.svg:1: an absolute machine path: {named} (name it from the repository root, ~/ or a variable)"
    )


def test_system_paths_home_relative_and_urls_pass(tmp_path):
    text = (
        "python -m venv /opt/vllm && /opt/vllm/bin/pip install vllm\n"
        "the sandbox's `/usr/src/app`; `~/tmp/run`; runs/grpo/tmp/x; http://localhost:8000/tmp/x\n"
    )
    assert _lint(tmp_path, text) == []


def test_the_repositorys_documentation_passes():
    problems = [problem for path in lint_docs.documents() for problem in lint_docs.lint(path)]
    assert problems == []
