"""What the Tinker API costs: one ``forward_backward(..., "importance_sampling")`` + ``optim_step`` round trip through
`lightning-rl serve` (the official SDK, the service in a process of its own) against the same update run in this
process with the trainer's own functions, as `lightning-rl fit`'s optimize phase runs it (`policy_logprobs`, the
`ImportanceSampling` surrogate summed over tokens, backward, AdamW step), on the same LoRA model and the same datums.

    python benchmarks/tinker_round_trip.py                        # 16 prompts x 8 samples, rank 8, 10 rounds, CPU
    python benchmarks/tinker_round_trip.py --rounds 3 --prompts 4 # a quick check that it runs

The datums are one step of examples/tinker_rl_loop.py: the shipped tiny policy's samples (8 new tokens at most) of
``--prompts`` training prompts, ``--group`` each, with the sampler's log-probs and centred rewards. The two variants
alternate A/B/A/B after one warm-up round each; both use ``--threads`` torch threads. Last line:
``service / in-process round trip: <ratio>x``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, load_note  # noqa: E402

KEY = "tml-round-trip-benchmark"


def start_service(threads: int, folder: str) -> tuple[subprocess.Popen, str]:
    from lightning_rl.core.models import TINY_MODEL_PATH

    command = [
        sys.executable, "-m", "lightning_rl.command", "serve", "--base_models", TINY_MODEL_PATH, "--api_keys", KEY,
        "--port", "0", "--threads", str(threads), "--checkpoint_dir", folder,
    ]  # fmt: skip
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:
        if line.startswith("lightning-rl serve: the Tinker API on "):
            return proc, line.split(" on ", 1)[1].split()[0]
    raise RuntimeError("lightning-rl serve did not start")


def rl_datums(sampler, tokenizer, prompts: int, group: int) -> tuple[list, list[int]]:
    """One step of the cookbook's RL loop: sampled groups, centred exact-match rewards, importance_sampling datums;
    and each datum's prompt length less one (where its sampled tokens start)."""
    from tinker import types

    from lightning_rl.data.tasks import arithmetic_rows

    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=0)
    data, starts = [], []
    for row in arithmetic_rows("train")[:prompts]:
        prompt = types.ModelInput.from_ints(tokenizer.encode(row["prompt"]))
        sequences = sampler.sample(prompt, group, params).result().sequences
        rewards = [
            float(tokenizer.decode(s.tokens, skip_special_tokens=True).strip() == row["answer"]) for s in sequences
        ]
        mean = sum(rewards) / len(rewards)
        for sequence, reward in zip(sequences, rewards):
            ob_len = prompt.length - 1
            model_input = prompt.append(types.EncodedTextChunk(tokens=sequence.tokens[:-1]))
            n = model_input.length
            data.append(
                types.Datum(
                    model_input=model_input,
                    loss_fn_inputs={
                        "target_tokens": [0] * ob_len + sequence.tokens,
                        "logprobs": [0.0] * ob_len + sequence.logprobs,
                        "advantages": [0.0] * ob_len + [reward - mean] * (n - ob_len),
                    },
                )
            )
            starts.append(ob_len)
    return data, starts


def in_process(data, starts: list[int], rank: int, lr: float):
    """The same LoRA model and update in this process: a function that runs one update on ``data``."""
    import torch

    from components.aggregator import TokenSum
    from components.surrogate import ImportanceSampling
    from lightning_rl.core.batch import RolloutBatch
    from lightning_rl.core.logprobs import policy_logprobs
    from lightning_rl.core.models import TINY_MODEL_PATH
    from lightning_rl.service.training import BaseModel, LoraRequest

    base = BaseModel(TINY_MODEL_PATH)
    model = base.client_module(base.lora_spec(LoraRequest(rank=rank, seed=0), 32.0))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    rows = []
    for datum, ob_len in zip(data, starts):  # split back into prompt and response, as the trainer holds a sampled batch
        tokens = datum.model_input.to_ints()
        advantages = datum.loss_fn_inputs["advantages"].tolist()
        targets = datum.loss_fn_inputs["target_tokens"].tolist()
        rows.append((tokens[: ob_len + 1], targets[ob_len:], datum.loss_fn_inputs["logprobs"].tolist()[ob_len:],
                     advantages[ob_len:]))  # fmt: skip
    p, r = max(len(x[0]) for x in rows), max(len(x[1]) for x in rows)
    b = len(rows)
    prompt_ids, prompt_mask = torch.zeros(b, p, dtype=torch.long), torch.zeros(b, p, dtype=torch.long)
    response_ids, response_mask = torch.zeros(b, r, dtype=torch.long), torch.zeros(b, r, dtype=torch.long)
    old, adv = torch.zeros(b, r), torch.zeros(b, r)
    for i, (prompt, response, q, a) in enumerate(rows):
        prompt_ids[i, p - len(prompt) :], prompt_mask[i, p - len(prompt) :] = torch.tensor(prompt), 1  # left-padded
        n = len(response)
        response_ids[i, :n], response_mask[i, :n] = torch.tensor(response), 1
        old[i, :n], adv[i, :n] = torch.tensor(q), torch.tensor(a)
    batch = RolloutBatch(response_ids, response_mask, prompt_ids, prompt_mask, old_logprobs=old, advantages=adv)
    surrogate, aggregator = ImportanceSampling(), TokenSum()

    def update():
        logprobs, _ = policy_logprobs(model, batch)  # (B, R)
        per_token, _ = surrogate(logprobs, batch)
        aggregator(per_token, batch.loss_mask, torch.ones(())).backward()
        torch.nn.utils.clip_grad_norm_(params, float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return update


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import tinker
    import torch
    from tinker import types

    from lightning_rl.core.models import TINY_MODEL_PATH

    torch.set_num_threads(args.threads)
    print(load_note(), flush=True)
    with tempfile.TemporaryDirectory() as folder:
        proc, url = start_service(args.threads, folder)
        try:
            service = tinker.ServiceClient(base_url=url, api_key=KEY)
            client = service.create_lora_training_client(base_model=TINY_MODEL_PATH, rank=args.rank, seed=0).result()
            tokenizer = client.get_tokenizer()
            sampler = client.save_weights_and_get_sampling_client().result()
            data, starts = rl_datums(sampler, tokenizer, args.prompts, args.group)
            tokens = sum(d.model_input.length for d in data)
            adam = types.AdamParams(learning_rate=1e-4, beta1=0.9, beta2=0.95, eps=1e-8)

            def remote():
                fwd_bwd = client.forward_backward(data, loss_fn="importance_sampling")
                optim = client.optim_step(adam)
                fwd_bwd.result()
                optim.result()

            local = in_process(data, starts, args.rank, 1e-4)
            times = {"service": [], "in-process": []}
            for i in range(args.rounds + 1):
                for name, run in (("service", remote), ("in-process", local)):
                    start = time.perf_counter()
                    run()
                    if i > 0:  # round 0 warms up
                        times[name].append(time.perf_counter() - start)
            service.close("success").result()
        finally:
            proc.kill()
            proc.wait()
    print(f"{len(data)} datums, {tokens} tokens, LoRA rank {args.rank}, {args.threads} thread(s), {args.rounds} rounds")
    for name, values in times.items():
        print(f"  {name:<11} {statistics.median(values) * 1e3:8.1f} ms median ({min(values) * 1e3:.1f} .. "
              f"{max(values) * 1e3:.1f})")  # fmt: skip
    print(load_note(), flush=True)
    ratio = statistics.median(times["service"]) / statistics.median(times["in-process"])
    print(f"service / in-process round trip: {ratio:.2f}x", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
