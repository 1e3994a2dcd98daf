"""Long, ragged responses: the trainer phases with fixed-size micro-batches against token-budget packed
micro-batches, and ``HFRollout`` with and without dropping finished rows, side by side.

    python benchmarks/long_responses.py                  # B = 16 samples (4 prompts x 4), responses 16..1024 tokens
    python benchmarks/long_responses.py --repeats 1 --batch 32
    python benchmarks/long_responses.py --device cuda --batch 64 --group 8 --hidden 1024 --layers 8 --budget 16384   # on a GPU

Policy: a random Llama wider than the shipped one (``--hidden`` 256, ``--layers`` 4, vocabulary 2,048), fp32.
Response lengths follow a discrete Pareto law (tail index 1.2) between 16 and ``--max-len`` 1,024 tokens: the
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
the peak memory is the resident-set high-water mark minus the resident memory before the phase
(``--device cuda``: the peak of allocated GPU memory above what was allocated before it; each phase
is timed between two device synchronisations). Not part of the test suite.
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
VOCAB, PROMPT, MIN_LEN, MAX_LEN, TAIL = 2048, 16, 16, 1024, 1.2  # MAX_LEN: --max-len's default
EOS, PAD = 1, 0
VARIANTS = {"trainer": ("padded", "packed"), "sampler": ("keep", "drop")}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build_policy(hidden: int = 256, layers: int = 4, max_len: int = MAX_LEN, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers, num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64, max_position_embeddings=max(2048, PROMPT + max_len), tie_word_embeddings=True, pad_token_id=PAD,
        eos_token_id=EOS, bos_token_id=None, attn_implementation="sdpa",
    )  # fmt: skip
    return LlamaForCausalLM(config)


def pareto_lengths(n: int, generator: torch.Generator, max_len: int = MAX_LEN) -> torch.Tensor:
    """The n quantiles i / n (i = 0..n-1) of P(L >= x) = (MIN_LEN / x) ** TAIL in [MIN_LEN, max_len], shuffled:
    a representative batch whose longest response hits the cap."""
    u = torch.arange(n, dtype=torch.float64)[torch.randperm(n, generator=generator)] / n
    return (MIN_LEN * u.pow(-1.0 / TAIL)).floor().clamp(MIN_LEN, max_len).long()


def trainer_batch(samples: int, group: int, seed: int = 0, max_len: int = MAX_LEN):
    from lightning_rl.core.batch import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    lengths = pareto_lengths(samples, g, max_len)
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
        old = torch.cat(
            [
                pad_to(policy_logprobs(policy, c, packed=packed)[0], batch.response_ids.shape[1])
                for c in micro_batches(batch, 16, max_tokens)
            ]
        )
    batch = batch.replace(old_logprobs=old)
    aggregator = TokenMean()
    total = aggregator.denominator(batch.loss_mask)
    for micro in micro_batches(batch, 8, max_tokens):
        logprobs, _ = policy_logprobs(policy, micro, with_entropy=True, packed=packed)
        ratio = (logprobs - micro.old_logprobs).exp()
        per_token = -torch.minimum(ratio * micro.advantages, ratio.clamp(0.8, 1.2) * micro.advantages)
        aggregator(per_token, micro.loss_mask, total).backward()


class EOSSchedule(nn.Module):
    """The policy with its EOS probability set by response length: 0 below MIN_LEN, TAIL / n from there, 1 at ``max_len``."""

    def __init__(self, policy, max_len: int = MAX_LEN):
        super().__init__()
        self.policy, self.config, self.max_len = policy, policy.config, max_len

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        use_cache=None,
        logits_to_keep=0,
    ):
        out = self.policy(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, past_key_values=past_key_values,
            use_cache=use_cache, logits_to_keep=logits_to_keep,
        )  # fmt: skip
        logits = out.logits[:, -1].float()  # (b, V): the next token
        length = (position_ids[:, -1] - PROMPT + 2).double()  # the response's length if the next token is EOS
        p = torch.where(length >= MIN_LEN, (TAIL / length).clamp(max=1.0), 0.0)
        p = torch.where(length >= self.max_len, 1.0, p).clamp(1e-12, 1 - 1e-12)
        others = torch.logsumexp(logits.index_fill(-1, torch.tensor([EOS], device=logits.device), float("-inf")), -1)
        logits[:, EOS] = (others.double() + torch.log(p / (1 - p))).float()
        out.logits = logits[:, None]
        return out


def run_sampler(policy, samples: int, group: int, drop: bool, max_len: int = MAX_LEN):
    from components.rollout import HFRollout
    from lightning_rl.core.batch import Prompts

    rollout = HFRollout(group_size=group, max_new_tokens=max_len, temperature=1.0, drop_finished_rows=drop)
    rollout.eos_token_id, rollout.pad_token_id = EOS, PAD
    device = next(policy.parameters()).device
    ids = torch.randint(2, VOCAB, (samples // group, PROMPT), generator=torch.Generator().manual_seed(1)).to(device)
    torch.manual_seed(0)
    return rollout.generate(Prompts(ids, torch.ones_like(ids)), EOSSchedule(policy, max_len))


class PeakMemory:
    """The phase's peak memory above what was in use before it: the resident set on CPU, allocated memory on CUDA."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.before = torch.cuda.memory_allocated() if self.cuda else rss_bytes()

    def mib(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(peak - self.before, 0) / 2**20


def worker(args) -> None:
    torch.set_num_threads(1)
    phase, variant = args.worker.split(":")
    device = torch.device(args.device)
    policy = build_policy(args.hidden, args.layers, args.max_len).to(device)
    if phase == "trainer":
        batch = trainer_batch(args.batch, args.group, max_len=args.max_len).to(device)
        tokens = int(batch.response_mask.sum()) + int(batch.prompt_mask.sum())
        policy.train()
        memory = PeakMemory(device)
        start = time.perf_counter()
        trainer_phases(policy, batch, variant == "packed", args.budget)
        peak = memory.mib()  # synchronises first: the phase's work is done
        seconds = time.perf_counter() - start
        extra = {"grad_norm": float(torch.cat([p.grad.flatten() for p in policy.parameters()]).norm())}
    else:
        memory = PeakMemory(device)
        start = time.perf_counter()
        out = run_sampler(policy, args.batch, args.group, variant == "drop", args.max_len)
        peak = memory.mib()
        seconds = time.perf_counter() - start
        tokens = int(out.response_mask.sum())
        ids = out.response_ids.cpu()
        extra = {"checksum": int((ids * torch.arange(ids.numel()).reshape(ids.shape)).sum()),
                 "max_len": int(out.response_lengths.max()), "min_len": int(out.response_lengths.min())}  # fmt: skip
    emit({"tokens_per_s": tokens / seconds, "seconds": seconds, "peak_mib": peak, "tokens": tokens, **extra})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16, help="samples per batch")
    parser.add_argument("--group", type=int, default=4, help="samples per prompt")
    parser.add_argument("--budget", type=int, default=2048, help="loop.max_tokens_per_micro_batch of the packed path")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--max-len", type=int, default=MAX_LEN, help="the longest response (the sampler's max_new_tokens)"
    )
    parser.add_argument("--hidden", type=int, default=256, help="the policy's width (a multiple of 64: 64 per head)")
    parser.add_argument("--layers", type=int, default=4, help="the policy's depth")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: torch {torch.__version__} sees no CUDA device")
    print(load_note())
    common = [f"--batch={args.batch}", f"--group={args.group}", f"--budget={args.budget}", f"--max-len={args.max_len}",
              f"--hidden={args.hidden}", f"--layers={args.layers}", f"--device={args.device}"]  # fmt: skip
    results = {(phase, v): [] for phase, vs in VARIANTS.items() for v in vs}
    for _ in range(args.repeats):
        for phase, variants in VARIANTS.items():
            for variant in variants:  # A/B alternation
                results[phase, variant].append(
                    run_worker(Path(__file__), [f"--worker={phase}:{variant}", *common], env=MALLOC_ENV)
                )
    print(load_note())
    print(f"\n{args.batch} samples ({args.group} per prompt), prompt {PROMPT} tokens, responses {MIN_LEN}..{args.max_len} (Pareto {TAIL}), "
          f"token budget {args.budget}, hidden {args.hidden} x {args.layers} layers, {args.repeats} repeat(s), {args.device}, 1 thread\n")  # fmt: skip
    print("| phase | variant | tokens/s | seconds | peak MiB | check |")
    print("|---|---|---|---|---|---|")
    for (phase, variant), runs in results.items():
        check = (
            f"grad norm {runs[0]['grad_norm']:.6g}"
            if phase == "trainer"
            else f"lengths {runs[0]['min_len']}..{runs[0]['max_len']}, checksum {runs[0]['checksum']}"
        )
        med = {k: statistics.median(r[k] for r in runs) for k in ("tokens_per_s", "seconds", "peak_mib")}
        print(
            f"| {phase} | {variant} | {med['tokens_per_s']:,.0f} | {med['seconds']:.2f} | {med['peak_mib']:.0f} | {check} |"
        )
    summary = {}
    for phase, (a, b) in VARIANTS.items():
        ratios = [rb["tokens_per_s"] / ra["tokens_per_s"] for ra, rb in zip(results[phase, a], results[phase, b])]
        memory = statistics.median(r["peak_mib"] for r in results[phase, b]) / max(
            1e-9, statistics.median(r["peak_mib"] for r in results[phase, a])
        )
        print(
            f"{phase}: {b} / {a} tokens/s {statistics.median(ratios):.2f}x (per repeat: {', '.join(f'{r:.2f}' for r in ratios)}); peak memory {memory:.2f}x"
        )
        key = "grad_norm" if phase == "trainer" else "checksum"
        first, second = results[phase, a][0][key], results[phase, b][0][key]
        summary[phase] = {
            **{f"{v}_tokens_per_s": statistics.median(r["tokens_per_s"] for r in results[phase, v]) for v in (a, b)},
            **{f"{v}_peak_mib": statistics.median(r["peak_mib"] for r in results[phase, v]) for v in (a, b)},
            "ratio": statistics.median(ratios), "same": abs(first - second) <= 1e-4 * abs(first) if phase == "trainer" else first == second,
        }  # fmt: skip
    emit(summary)  # the line benchmarks/gpu_check.py reads


if __name__ == "__main__":
    main()
