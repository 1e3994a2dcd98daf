"""Lint the documentation (README.md, docs/): what neither MkDocs' strict build nor a Markdown linter catches.

- **A table without its header row.** A table is a run of lines that begin with ``|`` (outside fenced code); its
  first line must be the header and its second the delimiter row (``|---|---|``) with as many cells. A run that
  starts with the delimiter row has no header (MkDocs then prints the pipes as text); a run without a delimiter row
  is not a table at all.
- **An absolute path of someone's machine** (``/home/...``, ``/work/...``, ``/tmp/...``, ``/Users/...``), in the
  text, in code blocks and in the console pictures (``docs/*.svg``): a reader's machine has none of them. Name paths
  from the repository root (``runs/grpo``), the home folder (``~/``) or a variable.

    python scripts/lint_docs.py            # README.md and docs/; exits 1 naming file:line of each problem
    python scripts/lint_docs.py FILE...    # these files only

`make docs` runs it before ``mkdocs build --strict``, in CI too (.ci/run).
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MACHINE_PATH = re.compile(r"(?<![\w.~/-])/(?:home|work|tmp|Users|root|mnt|scratch)/[\w.-]*")
"""An absolute path under a folder that belongs to one machine or user; system paths (``/opt``, ``/usr``, ``/etc``)
that an install step names are not."""
DELIMITER = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def cells(row: str) -> int:
    """The number of cells of a table row (pipes escaped as ``\\|`` or inside backticks are not separators)."""
    row = re.sub(r"`[^`]*`", "code", row.replace("\\|", ""))
    return len(row.strip().strip("|").split("|"))


def table_problems(lines: list[str]) -> list[tuple[int, str]]:
    """(line number, problem) for each table of ``lines`` (Markdown) without its header row."""
    problems, run, fenced = [], [], False

    def check(run: list[tuple[int, str]]) -> None:
        if not run:
            return
        (first, header), rest = run[0], run[1:]
        if DELIMITER.match(header):
            problems.append((first, "a table without a header row: its first line is the delimiter row (|---|)"))
        elif not rest or not DELIMITER.match(rest[0][1]):
            problems.append((first, "a table without a header row: no delimiter row (|---|) under its first line"))
        elif cells(header) != cells(rest[0][1]):
            problems.append(
                (first, f"the header row has {cells(header)} cells and the delimiter row {cells(rest[0][1])}")
            )

    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            fenced = not fenced
        if not fenced and line.lstrip().startswith("|"):
            run.append((number, line))
            continue
        check(run)
        run = []
    check(run)
    return problems


def path_problems(lines: list[str]) -> list[tuple[int, str]]:
    """(line number, problem) for each absolute machine path in ``lines``."""
    return [
        (number, f"an absolute machine path: {found.group(0)} (name it from the repository root, ~/ or a variable)")
        for number, line in enumerate(lines, 1)
        for found in MACHINE_PATH.finditer(html.unescape(line).replace("\xa0", " "))
    ]


def lint(path: Path) -> list[str]:
    """``file:line: problem`` for each problem of one Markdown file or console picture."""
    lines = path.read_text(encoding="utf-8").splitlines()
    problems = path_problems(lines)
    if path.suffix == ".md":
        problems += table_problems(lines)
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return [f"{shown}:{number}: {problem}" for number, problem in sorted(problems)]


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "docs").rglob("*.svg"))]


def main(argv: list[str]) -> int:
    paths = [Path(p).resolve() for p in argv] or documents()
    problems = [problem for path in paths for problem in lint(path)]
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"lint_docs: {len(problems)} problem(s) in the documentation", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
