"""A round of 1,024 OpenAIAgent episodes connecting to the endpoint at once, with CPU-bound processes beside the
trainer: does any episode get lost (``agent/error_frac``)?

    python benchmarks/agent_episodes_at_once.py                       # 3 runs of 1,024 episodes, 2 busy processes
    python benchmarks/agent_episodes_at_once.py --runs 1 --prompts 4 --group-size 64 --busy 0

Each episode is the three-turn tool loop of tests/components/test_openai_tito.py (a plain OpenAI client: ask, get a
tool call, send its result back, twice, then the answer) on the ChatML test tokenizer, sampled by the scripted sampler
of tests/support/openai.py, so the round's cost is the endpoint, the agents' clients and their threads: 3,072 calls.
The busy processes (``while True: pass``, started and stopped by this script) take the two cores the way other jobs
do. Before the fix (a shared httpx pool), 1-2 of 1,024 episodes failed per run with ``APIConnectionError``
(``ReadError: [Errno 9] Bad file descriptor``). Not part of the test suite.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import load_note  # noqa: E402
from components.rollout import OpenAIAgent  # noqa: E402
from components.rollout.endpoint import HermesToolCalls  # noqa: E402
from tests.fixtures.chat_templates import family_tokenizer  # noqa: E402
from tests.helpers import prompts  # noqa: E402
from tests.support.openai import ScriptedChat  # noqa: E402


def one_round(n_prompts: int, group_size: int, timeout_s: float) -> dict:
    tokenizer = family_tokenizer("chatml")
    sampler = ScriptedChat(tokenizer, "chatml", group_size=group_size)
    sampler.setup(tokenizer)
    agent = OpenAIAgent(  # no policy here: no context to derive max_total_tokens from
        "tests.components.test_openai_tito.tool_agent",
        tool_calls=HermesToolCalls(),
        timeout_s=timeout_s,
        max_total_tokens=1024,
    )
    agent.setup(tokenizer, sampler)
    rows = [{"prompt": f"{i}+2?"} for i in range(n_prompts)]
    ids = [tokenizer.encode(r["prompt"], add_special_tokens=False) for r in rows]
    start = time.monotonic()
    try:
        batch, metrics = agent.generate(sampler, prompts(ids, None, rows), None)
    finally:
        agent.close()
    errors = Counter(e.split(" for url")[0][:200] for e in batch.columns["agent_error"][::3] if e)
    return {
        "episodes": n_prompts * group_size,
        "error_frac": float(metrics["agent/error_frac"]),
        "timeout_frac": float(metrics["agent/timeout_frac"]),
        "turns_mean": float(metrics["agent/turns_mean"]),
        "seconds": time.monotonic() - start,
        "errors": errors.most_common(3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound processes beside the trainer")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="each episode's timeout_s")
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        time.sleep(1.0)
        print(load_note(), f"({args.busy} busy processes started)")
        for run in range(args.runs):
            result = one_round(args.prompts, args.group_size, args.timeout_s)
            print(
                f"run {run + 1}: {result['episodes']} episodes at once, agent/error_frac {result['error_frac']:g}, "
                f"agent/timeout_frac {result['timeout_frac']:g}, agent/turns_mean {result['turns_mean']:g}, "
                f"{result['seconds']:.1f} s" + (f"; errors: {result['errors']}" if result["errors"] else ""),
                flush=True,
            )
        print(load_note())
    finally:
        for process in busy:
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
