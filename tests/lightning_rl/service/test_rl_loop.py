"""The acceptance of the Tinker API service: the RL loop of examples/tinker_rl_loop.py (written as the tinker-cookbook's
rl_loop.py is, with the official SDK only) trains the shipped tiny policy through `lightning-rl serve`, each in a
process of its own: held-out greedy accuracy 0.31 -> at least 0.71 on CPU."""

import json
import subprocess
import sys

import pytest

from tests.support.tinker_service import ROOT, serve_command

pytest.importorskip("tinker", reason="the official tinker SDK (a dev dependency on Python >= 3.11)")
pytestmark = [pytest.mark.slow]
KEY = "tml-rl-loop-test"


@pytest.mark.soak  # make test keeps the SDK's loops (tests/lightning_rl/service/test_sdk.py)
def test_the_cookbook_rl_loop_trains_the_tiny_policy_through_lightning_rl_serve(tmp_path):
    with serve_command(tmp_path / "serve", KEY) as url:
        done = subprocess.run(
            [sys.executable, "examples/tinker_rl_loop.py", "--steps", "40", "--eval-every", "40",
             "--json", str(tmp_path / "result.json")],
            cwd=ROOT, env=_env(url), capture_output=True, text=True, timeout=1200,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    accuracy = {int(step): value for step, value in result["accuracy"].items()}
    assert accuracy[0] == pytest.approx(0.31, abs=0.005), done.stdout  # the shipped policy, greedy, 500 prompts
    assert accuracy[40] >= 0.71, done.stdout
    assert len(result["rewards"]) == 40


def _env(url: str) -> dict:
    import os

    return {**os.environ, "TINKER_BASE_URL": url, "TINKER_API_KEY": KEY, "PYTHONUNBUFFERED": "1"}
