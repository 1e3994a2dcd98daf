"""Tool calls of a round's episodes: concurrent (MultiTurnRollout's ``max_concurrent_tools``) against one after another.

    python benchmarks/agent_rounds.py                    # 128 episodes, a tool that waits 0.5 s; the sandbox's cost
    python benchmarks/agent_rounds.py --episodes 64 --sandbox-calls 0

1. A round of ``--episodes`` episodes (MultiTurnRollout + ToolEnvironment, on a scripted sampler so that only the tools
   cost time): each calls once a FunctionTool whose function waits 0.5 s (a SandboxFusion server or a search API's
   latency) and answers on its next turn. Serial: ``max_concurrent_tools: 1`` and one worker process; concurrent: the
   defaults (components.env.tool_concurrency(): 8 per core, 16 to 128). A warm-up round first starts the workers.
2. PythonTool (the kernel sandbox) running ``print(1)``: the median of ``--sandbox-calls`` calls one after another,
   then as many calls through a pool of tool_concurrency() threads (the pool full): wall time per call and the
   median latency of a call. Skipped where the sandbox cannot be built.

The last line reads ``concurrent / serial tools: <ratio>x``. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks._common import load_note  # noqa: E402
from components.env import FunctionTool, PythonTool, ToolEnvironment, ToolError, tool_concurrency  # noqa: E402
from components.rollout import MultiTurnRollout  # noqa: E402
from components.rollout.base import response_mask_from_eos  # noqa: E402
from lightning_rl.core.batch import Prompts, RolloutBatch  # noqa: E402
from lightning_rl.core.contracts import Rollout  # noqa: E402
from lightning_rl.core.models import load_tokenizer  # noqa: E402
from lightning_rl.core.sampling_params import SamplingParams  # noqa: E402

TOKENIZER = ROOT / "lightning_rl" / "assets" / "tiny-calc"


class CallThenAnswer(Rollout):
    """Every episode calls the tool with its index on its first turn (``<call>k</call>``) and answers on its second."""

    def __init__(self, tokenizer):
        self.tokenizer, self.params = tokenizer, SamplingParams(group_size=1, max_new_tokens=16)
        self.provides = Rollout.provides | {"rollout_logprobs"}
        self.setup(tokenizer)

    def generate(self, prompts, policy, params=None):
        enc = lambda text: self.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
        first = "<call>" not in self.tokenizer.decode(prompts.prompt_ids[0], skip_special_tokens=False)
        turns = [enc(f"<call>{i}</call>") if first else enc("7") + [self.eos_token_id] for i in range(len(prompts))]
        width = max(len(t) for t in turns)
        ids = torch.tensor([t + [self.pad_token_id] * (width - len(t)) for t in turns])
        mask, truncated = response_mask_from_eos(ids, (params or self.params).eos_ids(self.eos_token_id))
        return RolloutBatch(response_ids=ids, response_mask=mask, truncated=truncated, rollout_logprobs=-0.1 * mask)


def round_seconds(episodes: int, concurrent: bool, tokenizer) -> tuple[float, float]:
    """(seconds of a warm-up round, seconds of the measured round), each answer checked against its episode."""
    from benchmarks._tools import wait_half_second

    tool = FunctionTool(wait_half_second, name="wait", timeout_s=10.0, max_workers=None if concurrent else 1)
    env = ToolEnvironment([tool], default_tool="wait")
    agent = MultiTurnRollout(env, max_turns=2, max_total_tokens=64, max_concurrent_tools=None if concurrent else 1)
    sampler = CallThenAnswer(tokenizer)
    agent.setup(tokenizer, sampler)
    prompt = torch.tensor([tokenizer.encode("12*34=", add_special_tokens=False)] * episodes)
    times = []
    try:
        for _ in range(2):
            start = time.monotonic()
            batch, metrics = agent.generate(sampler, Prompts(prompt, torch.ones_like(prompt)), None)
            times.append(time.monotonic() - start)
            for i in range(episodes):  # each episode read its own answer
                text = tokenizer.decode(batch.response_ids[i], skip_special_tokens=False)
                assert f"<result>{i}</result>" in text, text
            assert float(metrics["tool/error_frac"]) == 0
    finally:
        agent.close()
    return times[0], times[1]


def sandbox_costs(calls: int) -> dict | None:
    try:
        tool = PythonTool(timeout_s=10.0)
    except RuntimeError as err:
        print(f"sandbox: skipped ({str(err)[:120]})")
        return None

    def timed(_=None) -> float:
        start = time.monotonic()
        try:
            assert tool("print(1)") == "1"
        except ToolError as err:
            raise RuntimeError(f"the sandbox failed: {err}") from None
        return time.monotonic() - start

    timed()  # the interpreter's files in the page cache
    serial = [timed() for _ in range(calls)]
    workers = tool_concurrency()
    with ThreadPoolExecutor(workers) as pool:
        start = time.monotonic()
        latencies = list(pool.map(timed, range(calls)))
        wall = time.monotonic() - start
    return {
        "serial_median_ms": 1000 * statistics.median(serial),
        "pool": workers,
        "pool_wall_per_call_ms": 1000 * wall / calls,
        "pool_median_latency_ms": 1000 * statistics.median(latencies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--sandbox-calls", type=int, default=64, help="PythonTool calls per variant (0 = skip)")
    args = parser.parse_args()
    print(load_note())
    tokenizer = load_tokenizer(str(TOKENIZER))
    if args.sandbox_calls:
        costs = sandbox_costs(args.sandbox_calls)
        if costs is not None:
            print(
                f"sandbox (PythonTool, print(1)), {args.sandbox_calls} calls: one after another {costs['serial_median_ms']:.0f} ms "
                f"a call (median); through a full pool of {costs['pool']} threads {costs['pool_wall_per_call_ms']:.0f} ms "
                f"of wall time a call, each call {costs['pool_median_latency_ms']:.0f} ms (median latency)"
            )
    results = {}
    for concurrent in (False, True):
        warm, measured = round_seconds(args.episodes, concurrent, tokenizer)
        name = (
            f"concurrent (max_concurrent_tools {tool_concurrency()})"
            if concurrent
            else "serial (max_concurrent_tools 1)"
        )
        print(
            f"{args.episodes} episodes, a 0.5 s tool call each, {name}: {measured:.2f} s a round (warm-up round {warm:.2f} s)"
        )
        results[concurrent] = measured
    print(load_note())
    print(f"concurrent / serial tools: {results[False] / results[True]:.1f}x")


if __name__ == "__main__":
    main()
