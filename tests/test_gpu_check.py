"""benchmarks/gpu_check.sh, what can be checked without a GPU: it refuses to start without CUDA, saying what to run
instead; a part that overruns its budget is stopped with what it finished; a call always ends with its table."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.gpu_check import Check
from tests.helpers import pythonpath

ROOT = Path(__file__).resolve().parents[1]
NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}  # a GPU host's devices hidden as well


def test_without_cuda_it_stops_at_once_and_says_what_to_run(tmp_path):
    start = time.monotonic()
    done = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh"],
        cwd=ROOT,
        env={**NO_GPU, "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and time.monotonic() - start < 60
    assert "no CUDA device here" in done.stderr and "bash benchmarks/gpu_check.sh --cpu-dry-run" in done.stderr
    assert not (tmp_path / "gpu_check.md").exists()  # nothing measured, no table pretending otherwise


def test_a_part_over_its_budget_is_stopped_with_what_it_finished(tmp_path):
    check = Check(tmp_path, budget=60, dry_run=True)
    worker = "import time; print('BENCH_RESULT {\"before\": 0.5}', flush=True); time.sleep(60)"
    start = time.monotonic()
    code, results, text, seconds = check.run([sys.executable, "-c", worker], budget=3)
    assert code is None and results == [{"before": 0.5}] and 2.5 < seconds < 20 and time.monotonic() - start < 20
    assert "BENCH_RESULT" in (tmp_path / "gpu_check.log").read_text()


@pytest.mark.slow
def test_parts_the_budget_cannot_cover_are_skipped_and_the_table_still_printed(tmp_path):
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--cpu-dry-run", "--parts", "b,c", "--budget", "25", "--out", str(tmp_path)],
        cwd=ROOT, env={**NO_GPU, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    table = (tmp_path / "gpu_check.md").read_text()
    assert done.stdout.rstrip().endswith(table.rstrip().splitlines()[-1])  # the table is printed last
    assert "| b jobs |" in table and "| c trl |" in table and table.count("skipped") == 2


def test_processes_the_tests_start_keep_the_packages_the_parent_imports_by_pythonpath(tmp_path, monkeypatch):
    """On the GPU machine the carried wheels are importable through PYTHONPATH alone: a server, a rank or a CLI run
    that a test starts must see them too (each imports jsonargparse through lightning_rl.cli)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "carried_probe.py").write_text("VALUE = 7\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    code = "import carried_probe, tests.fixtures.sglang_server; print(carried_probe.VALUE)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd="/",
        env={**os.environ, "PYTHONPATH": pythonpath()},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and out.stdout.strip() == "7", out.stderr[-2000:]


def test_the_mfu_counts_every_linear_weight_once_by_hand():
    """N in the update's MFU, 6 N T / (t x peak): one layer of hidden 8, MLP 16, 2 heads and a 50-token vocabulary has
    q, k, v, o 4 x 8 x 8 = 256, gate, up, down 3 x 8 x 16 = 384 and the LM head 50 x 8 = 400 weights: 1,040; the
    embedding lookup and the norms multiply nothing, and a tied head is counted once."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from benchmarks._common import matmul_parameters

    for tied in (False, True):
        config = LlamaConfig(vocab_size=50, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=tied)  # fmt: skip
        assert matmul_parameters(LlamaForCausalLM(config)) == 1040


def test_every_test_the_check_runs_exists():
    """Tests move (the layout of tests/ follows the package's): the device run must not spend its minutes on a path
    that is gone."""
    from benchmarks.gpu_check import CPU_TWINS, GPU_TESTS

    root = Path(__file__).resolve().parents[1]
    assert [t for t in GPU_TESTS + CPU_TWINS if not (root / t.split("::")[0]).is_file()] == []
