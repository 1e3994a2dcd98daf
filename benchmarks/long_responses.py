"""Long, ragged responses: the trainer phases with fixed-size micro-batches against token-budget packed
micro-batches, and ``HFRollout`` with and without dropping finished rows, side by side.

    python benchmarks/long_responses.py                  # B = 16 samples (4 prompts x 4), responses 16..1024 tokens
    python benchmarks/long_responses.py --repeats 1 --batch 32

Policy: a random Llama wider than the shipped one (hidden 256, 4 layers, vocabulary 2,048), fp32.
Response lengths follow a discrete Pareto law (tail index 1.2) between 16 and 1,024 tokens: the
trainer's batch takes its quantiles (random tokens); the sampler forces them with an EOS schedule
(the policy's EOS probability at response length n is 1.2 / n from n = 16 on, and 1 at 1,024), a
hazard that depends only on the position, so both sampler variants draw the same responses.

Trainer phases (what one on-policy iteration with recomputed old log-probs runs): a no-grad forward
over the batch for the old log-probs, then the clipped surrogate forward + backward over micro-batches
(token-mean loss, its normaliser shared). Padded: today's ``forward_batch_size`` / ``micro_batch_size``
chunks of the whole batch's width. Packed: ``loop.max_tokens_per_micro_batch`` (``--budget`` tokens)
micro-batches, each one packed row. Tokens/s count real prompt + response tokens.

Each variant runs in a fresh process with one torch thread, variants alternating A/B over
``--repeats``; glibc's mmap threshold is fixed at 128 KiB so freed tensors leave the resident set, and
the peak memory is the resident-set high-water mark minus the resident memory before the phase.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks._common import emit, load_note, run_worker  # noqa: E402

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"}
VOCAB, PROMPT, MIN_LEN, MAX_LEN, TAIL = 2048, 16, 16, 1024, 1.2
EOS, PAD = 1, 0
VARIANTS = {"trainer": ("padded", "packed"), "sampler": ("keep", "drop")}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build_policy(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=2048, tie_word_embeddings=True, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=None,
        attn_implementation="sdpa",
    )  # fmt: skip
    return LlamaForCausalLM(config)


def pareto_lengths(n: int, generator: torch.Generator) -> torch.Tensor:
    """The n quantiles i / n (i = 0..n-1) of P(L >= x) = (MIN_LEN / x) ** TAIL in [MIN_LEN, MAX_LEN], shuffled:
    a representative batch whose longest response hits the cap."""
    u = torch.arange(n, dtype=torch.float64)[torch.randperm(n, generator=generator)] / n
    return (MIN_LEN * u.pow(-1.0 / TAIL)).floor().clamp(MIN_LEN, MAX_LEN).long()


def trainer_batch(samples: int, group: int, seed: int = 0):
    from lightning_rl.core.batch import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    lengths = pareto_lengths(samples, g)
    width = int(lengths.max())
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    prompts = torch.randint(2, VOCAB, (samples // group, PROMPT), generator=g).repeat_interleave(group, 0)
    return RolloutBatch(
        prompt_ids=prompts, prompt_mask=torch.ones_like(prompts),
        response_ids=torch.randint(2, VOCAB, (samples, width), generator=g) * mask, response_mask=mask,
        advantages=torch.randn(samples, width, generator=g) * mask,
    )  # fmt: skip


def trainer_phases(policy, batch, packed: bool, budget: int) -> None:
    """Old log-probs (no grad), then the clipped surrogate forward + backward over micro-batches."""
    from components.aggregator import TokenMean
    from lightning_rl.core.logprobs import policy_logprobs
    from lightning_rl.core.microbatch import micro_batches, pad_to

    max_tokens = budget if packed else None
    with torch.no_grad():
        old = torch.cat([pad_to(policy_logprobs(policy, c, packed=packed)[0], batch.response_ids.shape[1]) for c in micro_batches(batch, 16, max_tokens)])
    batch = batch.replace(old_logprobs=old)
    aggregator = TokenMean()
    total = aggregator.denominator(batch.loss_mask)
    for micro in micro_batches(batch, 8, max_tokens):
        logprobs, _ = policy_logprobs(policy, micro, with_entropy=True, packed=packed)
        ratio = (logprobs - micro.old_logprobs).exp()
        per_token = -torch.minimum(ratio * micro.advantages, ratio.clamp(0.8, 1.2) * micro.advantages)
        aggregator(per_token, micro.loss_mask, total).backward()


class EOSSchedule(nn.Module):
    """The policy with its EOS probability set by response length: 0 below MIN_LEN, TAIL / n from there, 1 at MAX_LEN."""

    def __init__(self, policy):
        super().__init__()
        self.policy, self.config = policy, policy.config

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None, logits_to_keep=0):
        out = self.policy(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, past_key_values=past_key_values,
            use_cache=use_cache, logits_to_keep=logits_to_keep,
        )  # fmt: skip
        logits = out.logits[:, -1].float()  # (b, V): the next token
        length = (position_ids[:, -1] - PROMPT + 2).double()  # the response's length if the next token is EOS
        p = torch.where(length >= MIN_LEN, (TAIL / length).clamp(max=1.0), 0.0)
        p = torch.where(length >= MAX_LEN, 1.0, p).clamp(1e-12, 1 - 1e-12)
        others = torch.logsumexp(logits.index_fill(-1, torch.tensor([EOS]), float("-inf")), -1)
        logits[:, EOS] = (others.double() + torch.log(p / (1 - p))).float()
        out.logits = logits[:, None]
        return out


def run_sampler(policy, samples: int, group: int, drop: bool):
    from components.rollout import HFRollout

    rollout = HFRollout(group_size=group, max_new_tokens=MAX_LEN, temperature=1.0, drop_finished_rows=drop)
    rollout.eos_token_id, rollout.pad_token_id = EOS, PAD
    prompts = torch.randint(2, VOCAB, (samples // group, PROMPT), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    return rollout.generate(prompts, torch.ones_like(prompts), EOSSchedule(policy))


def worker(args) -> None:
    torch.set_num_threads(1)
    phase, variant = args.worker.split(":")
    policy = build_policy()
    if phase == "trainer":
        batch = trainer_batch(args.batch, args.group)
        tokens = int(batch.response_mask.sum()) + int(batch.prompt_mask.sum())
        policy.train()
        before = rss_bytes()
        start = time.perf_counter()
        trainer_phases(policy, batch, variant == "packed", args.budget)
        seconds = time.perf_counter() - start
        extra = {"grad_norm": float(torch.cat([p.grad.flatten() for p in policy.parameters()]).norm())}
    else:
        before = rss_bytes()
        start = time.perf_counter()
        out = run_sampler(policy, args.batch, args.group, variant == "drop")
        seconds = time.perf_counter() - start
        tokens = int(out.response_mask.sum())
        extra = {"checksum": int((out.response_ids * torch.arange(out.response_ids.numel()).reshape(out.response_ids.shape)).sum()),
                 "max_len": int(out.response_lengths.max()), "min_len": int(out.response_lengths.min())}  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    emit({"tokens_per_s": tokens / seconds, "seconds": seconds, "peak_mib": max(peak, 0) / 2**20, "tokens": tokens, **extra})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16, help="samples per batch")
    parser.add_argument("--group", type=int, default=4, help="samples per prompt")
    parser.add_argument("--budget", type=int, default=2048, help="loop.max_tokens_per_micro_batch of the packed path")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    print(load_note())
    common = [f"--batch={args.batch}", f"--group={args.group}", f"--budget={args.budget}"]
    results = {(phase, v): [] for phase, vs in VARIANTS.items() for v in vs}
    for _ in range(args.repeats):
        for phase, variants in VARIANTS.items():
            for variant in variants:  # A/B alternation
                results[phase, variant].append(run_worker(Path(__file__), [f"--worker={phase}:{variant}", *common], env=MALLOC_ENV))
    print(load_note())
    print(f"\n{args.batch} samples ({args.group} per prompt), prompt {PROMPT} tokens, responses {MIN_LEN}..{MAX_LEN} (Pareto {TAIL}), "
          f"token budget {args.budget}, {args.repeats} repeat(s), 1 thread\n")  # fmt: skip
    print("| phase | variant | tokens/s | seconds | peak MiB | check |")
    print("|---|---|---|---|---|---|")
    for (phase, variant), runs in results.items():
        check = f"grad norm {runs[0]['grad_norm']:.6g}" if phase == "trainer" else f"lengths {runs[0]['min_len']}..{runs[0]['max_len']}, checksum {runs[0]['checksum']}"
        med = {k: statistics.median(r[k] for r in runs) for k in ("tokens_per_s", "seconds", "peak_mib")}
        print(f"| {phase} | {variant} | {med['tokens_per_s']:,.0f} | {med['seconds']:.2f} | {med['peak_mib']:.0f} | {check} |")
    for phase, (a, b) in VARIANTS.items():
        ratios = [rb["tokens_per_s"] / ra["tokens_per_s"] for ra, rb in zip(results[phase, a], results[phase, b])]
        memory = statistics.median(r["peak_mib"] for r in results[phase, b]) / max(1e-9, statistics.median(r["peak_mib"] for r in results[phase, a]))
        print(f"{phase}: {b} / {a} tokens/s {statistics.median(ratios):.2f}x (per repeat: {', '.join(f'{r:.2f}' for r in ratios)}); peak memory {memory:.2f}x")


if __name__ == "__main__":
    main()
