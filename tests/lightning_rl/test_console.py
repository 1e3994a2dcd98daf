"""What the console shows is read by people: numbers rounded, every warning a whole sentence."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from lightning_rl.cli import main
from lightning_rl.console import results_table, rounded

from .cli_runs import cli_args

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "value, shown",
    [
        (float(torch.tensor(0.31)), "0.31"),  # 0.3100000023841858: a float32 read back as a double
        (float(torch.tensor(0.974)), "0.974"),
        (3.0, "3"),
        (0.0, "0"),
        (float(torch.tensor(12345.678)), "12345.6777"),
        (-0.5, "-0.5"),
        (1.2e-6, "1.200e-06"),
        (2.5e7, "2.500e+07"),
    ],
)
def test_a_metric_is_rounded_as_a_person_reads_it(value, shown):
    assert rounded(value) == shown


def test_validate_prints_its_results_table_with_rounded_numbers(tmp_path, tiny_model_path, capsys, monkeypatch):
    """Lightning printed every float in full (0.3100000023841858); `lightning-rl validate` prints the same table rounded."""
    from lightning import Trainer

    asked = {}

    def validate(self, *args, verbose=True, **kwargs):
        asked["verbose"] = verbose
        return [{"val/reward": float(torch.tensor(0.31)), "val/response_length": float(torch.tensor(2.9))}]

    monkeypatch.setattr(Trainer, "validate", validate)  # the results, without sampling anything
    capsys.readouterr()
    main(["validate", *cli_args(tmp_path, tiny_model_path, 1, "--trainer.logger=false")])
    out = capsys.readouterr().out
    assert asked == {"verbose": False}  # Lightning's own table is not printed
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in out.splitlines() if line.count("│") == 3}
    assert rows == {"val/reward": "0.31", "val/response_length": "2.9"}
    assert "0.3100000023841858" not in out and "Validate metric" in out


def test_the_table_has_a_column_per_validation_set():
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(results_table([{"val/a/reward/dataloader_idx_0": 0.5}, {"val/b/reward/dataloader_idx_1": 0.25}]))
    text = console.export_text()
    assert "DataLoader 0" in text and "DataLoader 1" in text
    assert "│ val/a/reward    │ 0.5          │              │" in text


# the words an English sentence cannot end with: a message that ends with one was cut (the README quoted a warning
# ending "... skipped so")
DANGLING = {"and", "or", "the", "a", "an", "to", "of", "with", "for", "by", "but", "if", "when", "than", "which", "so"}
SAID = {"warn", "rank_zero_warn", "rank_zero_info", "warn_once", "warning", "info", "print", "write"}


def _literal_text(node) -> str | None:
    """A message's text with each formatted value as {} (None for a message built otherwise)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal_text(node.left), _literal_text(node.right)
        return None if left is None or right is None else left + right
    return None


def _messages(node):
    """Every string argument of a warning / log / console call, and every exception's message."""
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call) and n.args):
        name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
        if name in SAID or name.endswith(("Error", "Exception")):
            text = _literal_text(call.args[0])
            if text and " " in text.strip():
                yield call.lineno, text


def test_no_warning_log_line_or_error_ends_mid_sentence():
    cut = [
        f"{path.relative_to(ROOT)}:{line}: ...{text.rstrip()[-60:]!r}"
        for path in sorted([*ROOT.glob("lightning_rl/**/*.py"), *ROOT.glob("components/**/*.py")])
        for line, text in _messages(ast.parse(path.read_text()))
        if text.rstrip().rstrip(".!:;,").split()[-1].lower() in DANGLING
    ]
    assert not cut, "\n".join(cut)
