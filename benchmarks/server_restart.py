"""What a server restart costs: a launched vLLM server (vLLM's CPU build, the shipped tiny policy with widened heads) is
killed (kill -9) between two rollouts; the seconds of the next ``generate`` (the restart, the whole policy pushed and
verified, then the rollout) against a plain ``generate`` and against the first launch.

    python benchmarks/server_restart.py                 # real vLLM (needs .venv-vllm: make vllm-env)
    python benchmarks/server_restart.py --engine sglang  # the loopback SGLang stand-in (tests/fixtures/sglang_server.py)

Run it on an idle machine: a CPU server's start time is mostly importing torch and vLLM and loading the model, and
scales with the load. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from components.rollout.server.settings import Servers, Verification, WeightPush

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=["vllm", "sglang"], default="vllm")
    args = parser.parse_args()
    from lightning_rl.core.models import ModelSpec, load_causal_lm, load_tokenizer
    from tests.helpers import prompts

    folder = Path(tempfile.mkdtemp(prefix="server_restart_"))
    if args.engine == "vllm":
        from components.rollout import VLLMRollout
        from tests.fixtures.vllm_server import SERVER_ARGS, TINY_CALC, widen_heads

        model = str(widen_heads(TINY_CALC, folder / "tiny-calc-wide"))
        make = lambda: VLLMRollout(  # noqa: E731
            servers=Servers(launch=dict(SERVER_ARGS, model=model)),
            weights=WeightPush(weight_sync="distributed"),
            verify=Verification(every=1),
        )
    else:
        from components.rollout import SGLangRollout
        from tests.fixtures.sglang_server import fake_sglang_package
        from tests.helpers import pythonpath

        model = str(ROOT / "lightning_rl/assets/tiny-calc")
        fake_sglang_package(folder)
        os.environ["PYTHONPATH"] = pythonpath(folder)
        make = lambda: SGLangRollout(  # noqa: E731
            servers=Servers(launch={"model_path": model}), verify=Verification(every=1)
        )
    tokenizer, policy = load_tokenizer(model), load_causal_lm(ModelSpec(path=model))
    enc = tokenizer(["12+3=", "4*5="], return_tensors="pt", padding=True)
    asked = prompts(enc.input_ids, enc.attention_mask)
    start = time.perf_counter()
    rollout = make()
    rollout.setup(tokenizer)
    launched = time.perf_counter() - start
    try:
        rollout.generate(asked, policy)
        start = time.perf_counter()
        rollout.generate(asked, policy)
        plain = time.perf_counter() - start
        os.killpg(rollout.connection.launched[0].process.pid, signal.SIGKILL)
        start = time.perf_counter()
        rollout.generate(asked, policy)
        healed = time.perf_counter() - start
    finally:
        rollout.close()
    print(f"{args.engine}: first launch {launched:.1f} s; a rollout {plain:.2f} s; "
          f"a rollout after kill -9 (restart, whole push verified, rollout) {healed:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
