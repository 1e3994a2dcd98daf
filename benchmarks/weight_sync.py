"""One weight push of a random >= 300M-parameter policy to one and to two SGLang-API servers: ``weight_sync: disk``
against ``distributed`` (and ``tensor``, CUDA IPC, where the trainer has a GPU), alternated A/B, with the seconds
per push and the trainer's peak memory added by the push.

    python benchmarks/weight_sync.py                         # 341M bf16 Llama-style policy, 1 and 2 servers, 3 A/B rounds
    python benchmarks/weight_sync.py --dtype float32 --rounds 1 --servers 1

The policy is built here from a config (hidden 1024, 24 layers, 16 heads, MLP 2816, vocabulary 32000, tied
embeddings: 341M parameters), randomly initialised; nothing is downloaded. The servers are the loopback stand-in
the tests use (tests/fixtures/sglang_server.py: SGLang's native weight-update API over a transformers model, in
processes of their own, one torch thread each): ``/update_weights_from_disk`` reads the safetensors into the model's
tensors, ``/update_weights_from_distributed`` receives a gloo broadcast (nccl on GPUs) inside the request, as
SGLang does. Each measurement is a fresh trainer process (`SGLangRollout.sync_weights` as the trainer calls it);
the first push (for ``distributed`` it also builds the group) is reported apart from the steady pushes that follow
it, whose mean is the table's figure. Peak memory: the trainer's resident-set high-water mark during the steady
pushes minus its size before them. Every push is checked: the servers' weight checksums equal the trainer's. The
verification's cost (probe forward on the trainer, one probe request per server) is timed in the distributed runs.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import emit, load_note, run_worker  # noqa: E402

CONFIG = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16, intermediate_size=2816,
              vocab_size=32000, tie_word_embeddings=True, max_position_embeddings=2048)  # fmt: skip
TOKENIZER = ROOT / "lightning_rl" / "assets" / "tiny-arith"  # eos / pad ids only: no text is sampled here


def build_policy(dtype: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**CONFIG)).to(getattr(torch, dtype)).eval()


def _vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) << 10
    raise KeyError(field)


def worker(args: argparse.Namespace) -> None:
    import torch

    from components.rollout import SGLangRollout
    from components.rollout.sglang.client import SGLangClient
    from components.rollout.sglang.verify import check, server_logprobs, trainer_logprobs
    from lightning_rl.models import load_tokenizer

    torch.set_num_threads(args.threads)
    policy = build_policy(args.dtype).to(args.device)
    urls = args.urls.split(",")
    rollout = SGLangRollout(base_url=urls, weight_sync=args.variant, bucket_mb=args.bucket_mb, verify_every=0, timeout_s=1800.0, backoff=0.1)
    rollout.setup(load_tokenizer(str(TOKENIZER)))
    start = time.perf_counter()
    rollout.sync_weights(policy)
    first = time.perf_counter() - start
    Path("/proc/self/clear_refs").write_text("5")  # resets the high-water mark
    before, seconds = _vm("VmRSS"), []
    for _ in range(args.pushes):
        with torch.no_grad():
            for p in policy.parameters():  # a new version each time (an optimizer step's worth of change)
                p.mul_(1.0001)
        start = time.perf_counter()
        rollout.sync_weights(policy)
        seconds.append(time.perf_counter() - start)
    peak = _vm("VmHWM") - before
    result = {"first_s": first, "push_s": seconds, "peak_added_mb": peak / 2**20}
    expected = {n: hashlib.sha256(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()).hexdigest()[:16] for n, t in policy.state_dict().items()}
    client = SGLangClient(600.0, 0, 0.0)
    result["exact"] = all(client.request(url, "/weights_checker", method="GET")["ranks"][0]["checksums"] == expected for url in urls)
    if args.variant == "distributed":
        probe = list(range(1, 33))
        start = time.perf_counter()
        trainer = trainer_logprobs(policy, probe)
        for url in urls:
            served, version = server_logprobs(client, url, probe, None)
            check(url, served, trainer, version, str(rollout.weight_version), 0.05)
        result["verify_s"] = time.perf_counter() - start
    rollout.close()
    result["parameters"] = sum(p.numel() for p in policy.parameters())
    emit(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3, help="A/B rounds (the order flips every round)")
    parser.add_argument("--pushes", type=int, default=2, help="steady pushes per measurement, after the first")
    parser.add_argument("--bucket-mb", type=float, default=512)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the trainer (the servers use 1)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--urls", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    import torch

    from tests.fixtures.sglang_server import ServerProcess

    gpus = torch.cuda.device_count()
    variants = ["disk", "distributed"] + (["tensor"] if gpus else [])
    print(f"before: {load_note()}")
    results: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="weight_sync_") as tmp:
        from lightning_rl.models import load_tokenizer

        build_policy(args.dtype).save_pretrained(tmp)  # what the servers start from
        load_tokenizer(str(TOKENIZER)).save_pretrained(tmp)  # the loopback server reads eos / pad from the model's folder
        for n in args.servers:
            # on GPUs: the trainer on device 0, server i on device i + 1 (nccl refuses two ranks on one device)
            servers = [ServerProcess(tmp, env={"OMP_NUM_THREADS": "1"}, timeout_s=900, dtype=args.dtype, device=f"cuda:{i + 1}" if gpus > n else "cpu") for i in range(n)]
            try:
                for r in range(args.rounds):
                    for variant in variants if r % 2 == 0 else variants[::-1]:
                        worker_args = ["--worker", "--variant", variant, "--urls", ",".join(s.url for s in servers), "--dtype", args.dtype,
                                       "--pushes", str(args.pushes), "--bucket-mb", str(args.bucket_mb), "--threads", str(args.threads),
                                       "--device", "cuda:0" if gpus else "cpu"]  # fmt: skip
                        result = run_worker(Path(__file__), worker_args, env={"OMP_NUM_THREADS": str(args.threads)})
                        results.setdefault((variant, n), []).append(result)
                        print(f"  {n} server(s) {variant:11s} round {r}: " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in result.items()}), flush=True)
            finally:
                for server in servers:
                    server.stop()
    print(f"after: {load_note()}")
    params = next(iter(results.values()))[0]["parameters"]
    print(f"\n{params / 1e6:.0f}M parameters, {args.dtype}, bucket_mb {args.bucket_mb:g}, {args.rounds} A/B round(s) x {args.pushes} steady push(es)\n")
    print("| servers | weight_sync | seconds per push | first push (s) | trainer peak memory added (MiB) | servers hold the trainer's weights |")
    print("|---|---|---|---|---|---|")
    for (variant, n), runs in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        pushes = [s for run in runs for s in run["push_s"]]
        spread = f" +- {statistics.stdev(pushes):.2f}" if len(pushes) > 1 else ""
        print(f"| {n} | {variant} | {statistics.mean(pushes):.2f}{spread} | {statistics.mean(r['first_s'] for r in runs):.2f} | "
              f"{statistics.mean(r['peak_added_mb'] for r in runs):.0f} | {all(r['exact'] for r in runs)} |")
    for n in args.servers:
        disk = [s for run in results[("disk", n)] for s in run["push_s"]]
        for variant in variants[1:]:
            other = [s for run in results[(variant, n)] for s in run["push_s"]]
            print(f"\n{n} server(s): disk / {variant} = {statistics.mean(disk) / statistics.mean(other):.2f}x")
        verify = [run["verify_s"] for run in results[("distributed", n)]]
        print(f"{n} server(s): verification (trainer probe forward + one probe per server) {statistics.mean(verify) * 1e3:.0f} ms per push")


if __name__ == "__main__":
    main()
