"""Log-probs of the sampled tokens: ``lightning_rl.core.logprobs.sampled_logprobs`` (chunked, custom backward)
against the full fp32 ``log_softmax`` path, forward + backward, peak memory and time.

    python benchmarks/bench_logprobs.py                        # V = 32768, B x T = 16384 rows, bf16 logits
    python benchmarks/bench_logprobs.py --dtype float32
    python benchmarks/bench_logprobs.py --rows 4096 --vocab 32768 --repeats 3
    python benchmarks/bench_logprobs.py --top-p 0.9 --top-k 50  # a truncating sampler's (each token the argmax)

The full path is what a trainer writes first:
``torch.log_softmax(logits.float() / T, -1).gather(-1, targets)``; it keeps the fp32 (rows, V) copy, its
log-softmax and their gradients alive. The chunked path casts ``~16 MB`` of rows at a time to fp32 and
recomputes the softmax chunk by chunk in backward. With ``--top-p`` / ``--top-k`` both renormalise over the tokens
the truncation keeps: the full path through transformers' warpers on the fp32 copy, the chunked one through
`Truncation` (a sort per chunk); the targets are then each row's argmax, which every truncation keeps.

Memory: each variant runs in a fresh process (A/B/A/B over ``--repeats``) with glibc's mmap threshold
fixed at 128 KiB, so freed tensors leave the resident set at once (the time comes from a second run with the default
allocator, as that setting makes every large allocation fault its pages in). The logits (the model's
output, in ``--dtype``) are allocated first; the peak is the process's resident-set high-water mark
(``ru_maxrss``) minus its resident memory just before the forward pass, so it counts everything the
log-prob computation adds, forward and backward, including the gradient of the logits that both
paths must produce. Backward uses ``(logprobs * w).sum()`` with random per-token weights ``w`` (like
advantages). Exactness: log-probs of both paths on all rows, and the logits' gradients on the first
``--grad-check-rows`` rows, compared in the parent (|a - b| <= 1e-5 + 1e-5 |b| for the log-probs).
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks._common import emit, load_note, run_worker  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_inputs(rows: int, vocab: int, dtype: torch.dtype, seed: int = 0, argmax: bool = False):
    """Logits (rows, V) in ``dtype`` filled block by block (no fp32 copy of the whole matrix), targets (random, or
    each row's argmax), weights."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.empty(rows, vocab, dtype=dtype)
    block = max(1, (1 << 22) // vocab)
    for i in range(0, rows, block):
        logits[i : i + block] = (torch.randn(min(block, rows - i), vocab, generator=g) * 3).to(dtype)
    targets = torch.randint(0, vocab, (rows,), generator=g)
    weights = torch.randn(rows, generator=g)
    if argmax:
        targets = torch.cat([logits[i : i + block].argmax(-1) for i in range(0, rows, block)])
    return logits.requires_grad_(True), targets, weights


def full_path(logits, targets, temperature: float, top_k: int = 0, top_p: float = 1.0):
    z = logits.float() / temperature
    if top_k:
        from transformers.generation import TopKLogitsWarper

        z = TopKLogitsWarper(top_k)(None, z)
    if top_p < 1:
        from transformers.generation import TopPLogitsWarper

        z = TopPLogitsWarper(top_p)(None, z)
    return torch.log_softmax(z, dim=-1).gather(-1, targets[:, None]).squeeze(-1)


def chunked_path(logits, targets, temperature: float, top_k: int = 0, top_p: float = 1.0):
    from lightning_rl.core.logprobs import sampled_logprobs
    from lightning_rl.core.truncation import Truncation

    truncation = Truncation(top_k, top_p) if top_k or top_p < 1 else None
    return sampled_logprobs(logits, targets, temperature, truncation=truncation)


PATHS = {"full": full_path, "chunked": chunked_path}
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
"""glibc: every block >= 128 KiB gets its own mapping, returned to the system when freed. Without a fixed
threshold glibc raises it after the first large free and keeps freed chunks in the heap, so the
resident set would count memory the process no longer uses."""


def worker(args) -> dict:
    torch.set_num_threads(args.threads)
    path = PATHS[args.worker]
    truncating = args.top_k > 0 or args.top_p < 1
    small, small_targets, small_weights = make_inputs(4, args.vocab, DTYPES[args.dtype], seed=1, argmax=truncating)
    (
        path(small, small_targets, args.temperature, args.top_k, args.top_p) * small_weights
    ).sum().backward()  # imports, kernels, allocator: not counted
    logits, targets, weights = make_inputs(args.rows, args.vocab, DTYPES[args.dtype], argmax=truncating)
    before = rss_bytes()
    start = time.perf_counter()
    logprobs = path(logits, targets, args.temperature, args.top_k, args.top_p)
    (logprobs * weights).sum().backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    out = Path(args.out)
    torch.save({"logprobs": logprobs.detach(), "grad": logits.grad[: args.grad_check_rows].float()}, out)
    return {"added_bytes": peak - before, "seconds": seconds, "logits_bytes": logits.numel() * logits.element_size()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=16384, help="B x T: sampled tokens")
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="dtype of the model's logits")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="a truncating sampler's top-k (0: off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="a truncating sampler's top-p (1: off)")
    parser.add_argument("--repeats", type=int, default=1, help="A/B pairs (each run a fresh process)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--grad-check-rows", type=int, default=256)
    parser.add_argument("--worker", choices=sorted(PATHS), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        emit(worker(args))
        return
    print(f"before: {load_note()}", flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench-logprobs-"))
    common = [f"--rows={args.rows}", f"--vocab={args.vocab}", f"--dtype={args.dtype}", f"--temperature={args.temperature}",
              f"--top-k={args.top_k}", f"--top-p={args.top_p}", f"--threads={args.threads}", f"--grad-check-rows={args.grad_check_rows}"]  # fmt: skip
    runs: dict[str, list[dict]] = {"full": [], "chunked": []}
    for i in range(args.repeats):
        for name in ("full", "chunked"):  # A/B/A/B
            out = scratch / f"{name}-{i}.pt"
            memory = run_worker(Path(__file__), [f"--worker={name}", f"--out={out}", *common], env=MALLOC_ENV)
            timing = run_worker(
                Path(__file__), [f"--worker={name}", f"--out={out}.time", *common]
            )  # the default allocator
            runs[name].append({**memory, "seconds": timing["seconds"]})
            print(f"  {name}: {memory['added_bytes'] / 2**20:.0f} MiB added, {timing['seconds']:.2f} s", flush=True)
    print(f"after: {load_note()}\n")

    full, chunked = torch.load(scratch / "full-0.pt"), torch.load(scratch / "chunked-0.pt")
    lp_err = float(((chunked["logprobs"] - full["logprobs"]).abs() / (1e-5 + 1e-5 * full["logprobs"].abs())).max())
    diff = chunked["grad"] - full["grad"]  # (grad_check_rows, V)
    tie_err = None
    if args.top_k or args.top_p < 1:
        # the rule keeps a count of the tokens tied at its top-p boundary, cut by sort position (bf16 logits tie
        # often): the warpers give the kept ones their gradient, `Truncation` spreads it evenly over the tie. Compared:
        # every other token, and each tie's total
        from lightning_rl.core.truncation import Truncation

        rows = args.grad_check_rows
        logits, targets, _ = make_inputs(args.rows, args.vocab, DTYPES[args.dtype], argmax=True)
        z = logits.detach()[:rows].float() / args.temperature
        _, floor = Truncation(args.top_k, args.top_p).kept_logsumexp(z, targets[:rows])
        tie = z == floor[:, None]
        tie_err = float((diff * tie).sum(-1).abs().max())
        diff = diff.masked_fill(tie, 0.0)
    grad_err = float(diff.abs().max())
    mib = 2**20
    peak = {k: statistics.median(r["added_bytes"] for r in v) for k, v in runs.items()}
    secs = {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()}
    logits_mib = runs["full"][0]["logits_bytes"] / mib
    print(f"log-probs of sampled tokens, {args.rows} rows x V = {args.vocab}, {args.dtype} logits ({logits_mib:.0f} MiB), "
          f"forward + backward, {args.threads} thread(s), top-k {args.top_k}, top-p {args.top_p}")  # fmt: skip
    print("| path | peak memory added (MiB) | vs full | s |\n|---|---|---|---|")
    print(f"| full fp32 log_softmax | {peak['full'] / mib:.0f} | 100% | {secs['full']:.2f} |")
    print(
        f"| sampled_logprobs (chunked) | {peak['chunked'] / mib:.0f} | {100 * peak['chunked'] / peak['full']:.0f}% | {secs['chunked']:.2f} |"
    )
    print(f"(both include the logits' gradient, {logits_mib:.0f} MiB, which any path must produce)")
    print(f"log-probs: max |a - b| / (1e-5 + 1e-5 |b|) = {lp_err:.3f} ({'ok' if lp_err <= 1 else 'FAIL'}); "
          f"logits gradient, first {args.grad_check_rows} rows: max |a - b| = {grad_err:.2e}"
          + ("" if tie_err is None else f" off the top-p boundary's ties, {tie_err:.2e} on each tie's total"))  # fmt: skip
    if lp_err > 1:
        sys.exit(1)


if __name__ == "__main__":
    main()
