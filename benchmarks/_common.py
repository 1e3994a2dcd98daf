"""Shared by the benchmark scripts: machine load, A/B alternation in subprocesses, greedy evaluation."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT_PREFIX = "BENCH_RESULT "


def load_note() -> str:
    """The 1-minute load average and a warning when it means the timings cannot be trusted."""
    one, _, _ = os.getloadavg()
    cores = os.cpu_count() or 1
    note = f"load average {one:.2f} on {cores} cores"
    if one >= 1.0:
        note += " -- WARNING: other processes compete for the cores; timings may be far off (rerun on a quiet machine)"
    return note


def run_worker(script: Path, args: list[str], env: dict | None = None, python: str | None = None) -> dict:
    """Run ``script --worker ...`` in a fresh process (``python``: another environment's interpreter) and return the
    JSON it printed after RESULT_PREFIX."""
    proc = subprocess.run(
        [python or sys.executable, str(script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    raise RuntimeError(
        f"worker {script.name} {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )


def emit(result: dict) -> None:
    """What a worker prints last: one line the parent parses."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} +- {statistics.stdev(values):.3f}"


def greedy_accuracy(model, tokenizer, rows: list[dict], max_new_tokens: int, batch_size: int = 128) -> float:
    """Held-out greedy exact-match accuracy with the code `RLModule.validation_step` runs:
    ``HFRollout.generate`` with greedy settings, decode the valid tokens, ``ExactMatch`` on the ``answer`` column."""
    from dataclasses import replace

    import torch

    from components.reward import ExactMatch
    from components.rollout import HFRollout
    from lightning_rl.data.prompts import collate_prompts

    rollout = HFRollout(group_size=1, max_new_tokens=max_new_tokens)
    rollout.setup(tokenizer)
    reward = ExactMatch(answer_key="answer")
    was_training = model.training
    device = next(model.parameters()).device
    correct = 0.0
    with torch.no_grad():
        for i in range(0, len(rows), batch_size):
            chunk = rows[i : i + batch_size]
            prompts = collate_prompts(
                [{"input_ids": tokenizer(r["prompt"])["input_ids"], "answer": r["answer"]} for r in chunk],
                tokenizer.pad_token_id,
            )["prompts"]
            batch = rollout.generate(prompts.to(device), model, replace(rollout.params, greedy=True))
            lengths = batch.response_lengths.tolist()
            texts = tokenizer.batch_decode(
                [ids[:n] for ids, n in zip(batch.response_ids.tolist(), lengths)], skip_special_tokens=True
            )
            correct += float(reward(batch.with_columns(completions=texts)).sum())
    model.train(was_training)
    return correct / len(rows)


QWEN2_SHAPES = {
    # Qwen2.5-0.5B's architecture: 494M parameters, 358M of them in the 24 transformer layers
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
    # benchmarks/engine_scale.py: two sizes a 2-core CPU trains in minutes; an 8k vocabulary (the character tokenizer
    # padded to it) keeps the parameters in the layers, where a real model's compute is
    "30m": dict(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=10,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=8192,
    ),
    "80m": dict(
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        vocab_size=8192,
    ),
    "toy": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
    ),
}


def save_random_qwen2(directory: str | Path, shape: str = "0.5b", seed: int = 0) -> str:
    """A randomly initialised Qwen2 causal LM of ``QWEN2_SHAPES[shape]`` (tied embeddings, biased q/k/v, RoPE base 1e6)
    with the built-in task's character tokenizer padded to the model's vocabulary, so every sampled id decodes: built
    on this machine (on the GPU when there is one), nothing downloaded. Returns the directory."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from lightning_rl.recipes.tiny import build_char_tokenizer

    dims = QWEN2_SHAPES[shape]
    tokenizer = build_char_tokenizer(vocab_size=dims["vocab_size"])
    config = Qwen2Config(
        **dims, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def matmul_parameters(model) -> int:
    """Weights a token is multiplied by in one forward pass: every ``nn.Linear`` (the layers' projections and the LM
    head, counted once when tied to the embedding), not the embedding lookup or the norms."""
    import torch

    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
