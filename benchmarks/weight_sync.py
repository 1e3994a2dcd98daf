"""One weight push of a random >= 300M-parameter policy to one and to two SGLang-API servers: ``weight_sync: disk``
against ``distributed`` (and ``tensor``, CUDA IPC, where the trainer has a GPU), alternated A/B, with the seconds
per push and the trainer's peak memory added by the push.

    python benchmarks/weight_sync.py                         # 341M fp32 Llama-style policy, 1 and 2 servers, 3 A/B rounds
    python benchmarks/weight_sync.py --dtype bfloat16 --rounds 1 --servers 1
    python benchmarks/weight_sync.py --servers 2 --variants distributed:shared distributed:per-server  # group layouts

The policy is built here from a config (hidden 1024, 24 layers, 16 heads, MLP 2816, vocabulary 32000, tied
embeddings: 341M parameters), randomly initialised; nothing is downloaded. By default the servers are the loopback
stand-in the tests use (tests/fixtures/sglang_server.py: SGLang's native weight-update API over a transformers
model, in processes of their own, one torch thread each; on a machine with n + 1 GPUs the trainer takes GPU 0 and
server i GPU i + 1): ``/update_weights_from_disk`` reads the safetensors into the model's tensors,
``/update_weights_from_distributed`` receives the broadcast inside the request, as SGLang does. With
``--base-url`` the servers are running SGLang servers (other nodes) started from ``--save-policy``'s folder.

Each measurement is a fresh trainer process (`SGLangRollout.sync_weights` as the trainer calls it); the first push
(for ``distributed`` it also builds the group) is reported apart from the steady pushes that follow it, whose mean
is the table's figure. Peak memory: the trainer's resident-set high-water mark during the steady pushes minus its
size before them. Every measurement is checked: the loopback servers' weight checksums equal the trainer's, and
every server passes the verification probe, whose cost (each server's probe continuation, then the trainer's
forward) is what ``verify_every: 1`` adds to a push. Not part of the test suite.
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

from components.rollout.server.settings import Servers, Verification, WeightPush

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
    from components.rollout.server.probe import Probe, check_probe, probe_prompt, server_continuation, trainer_scores
    from components.rollout.sglang.client import SGLangClient, SGLangError
    from components.rollout.sglang.engine import SGLangEngine
    from lightning_rl.core.models import load_tokenizer

    torch.set_num_threads(args.threads)
    policy = build_policy(args.dtype).to(args.device)
    urls = args.urls.split(",")
    weight_sync, _, layout = args.variant.partition(":")
    rollout = SGLangRollout(servers=Servers(urls=tuple(urls), timeout_s=1800.0, backoff=0.1),
                            weights=WeightPush(weight_sync=weight_sync, bucket_mb=args.bucket_mb, weight_dir=args.weight_dir,
                                               master_address=args.master_address,
                                               group_per_server={"": None, "shared": False, "per-server": True}[layout]),
                            verify=Verification(every=0))  # fmt: skip
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
    client = SGLangClient(600.0, 0, 0.0)
    if not args.running:  # the loopback hashes its tensors as the trainer holds them (SGLang's are fused, sharded)
        expected = {
            n: hashlib.sha256(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()).hexdigest()[:16]
            for n, t in policy.state_dict().items()
        }
        result["exact"] = all(
            client.request(url, "/weights_checker", method="GET")["ranks"][0]["checksums"] == expected for url in urls
        )
    # what verify_every: 1 adds to a push (and the check for running servers): each server continues the probe, the
    # trainer scores the continuations in one forward
    prompt = probe_prompt(CONFIG["vocab_size"])
    start = time.perf_counter()
    engine = SGLangEngine(client)
    probes = [server_continuation(engine, url, Probe(prompt), None) for url in urls]
    result["verify_servers_s"] = time.perf_counter() - start
    expected = trainer_scores(policy, prompt, [ids for ids, _, _ in probes])
    for url, (_, served, version), mine in zip(urls, probes, expected):
        check_probe(SGLangError, url, served, mine, version, str(rollout.weight_version), args.verify_tolerance)
    result["verify_s"] = time.perf_counter() - start
    result["exact"] = result.get("exact", True)
    rollout.close()
    result["parameters"] = sum(p.numel() for p in policy.parameters())
    emit(result)


def save_policy(directory: str, dtype: str) -> None:
    """The random policy (and a tokenizer for its eos / pad ids): what the servers start from."""
    from lightning_rl.core.models import load_tokenizer

    build_policy(dtype).save_pretrained(directory)
    load_tokenizer(str(TOKENIZER)).save_pretrained(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="the trainer's default is float32"
    )
    parser.add_argument(
        "--servers", type=int, nargs="+", default=[1, 2], help="server counts to measure (the first n of --base-url)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="A/B rounds (the order flips every round)")
    parser.add_argument("--pushes", type=int, default=2, help="steady pushes per measurement, after the first")
    parser.add_argument("--bucket-mb", type=float, default=512)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads of the trainer (the loopback servers use 1)"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=None,
        help="weight_sync modes (default: disk distributed, and tensor with a GPU); distributed:shared and "
        "distributed:per-server choose the group layout (group_per_server), plain distributed the backend's default",
    )
    parser.add_argument(
        "--save-policy", metavar="DIR", help="write the random policy to DIR (for servers launched elsewhere) and exit"
    )
    parser.add_argument(
        "--base-url", nargs="+", help="running SGLang servers started from --save-policy's folder (none launched here)"
    )
    parser.add_argument(
        "--weight-dir", help="for disk: a folder every server reads (default: a temporary one on this host)"
    )
    parser.add_argument("--master-address", help="for distributed: this host's address as the servers reach it")
    parser.add_argument("--verify-tolerance", type=float, default=0.05)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--running", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--urls", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.save_policy:
        return save_policy(args.save_policy, args.dtype)

    import torch

    from tests.fixtures.sglang_server import ServerProcess

    gpus = torch.cuda.device_count()
    print(f"before: {load_note()}")
    results: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="weight_sync_") as tmp:
        if not args.base_url:
            save_policy(tmp, args.dtype)
        for n in args.servers:
            # on GPUs: the trainer on device 0, loopback server i on device i + 1 (nccl refuses two ranks on one device)
            on_gpus = gpus > n or (args.base_url and gpus > 0)
            variants = args.variants or ["disk", "distributed"] + (["tensor"] if on_gpus and not args.base_url else [])
            launched = [] if args.base_url else [
                ServerProcess(tmp, env={"OMP_NUM_THREADS": "1"}, timeout_s=900, dtype=args.dtype, device=f"cuda:{i + 1}" if on_gpus else "cpu") for i in range(n)
            ]  # fmt: skip
            urls = args.base_url[:n] if args.base_url else [s.url for s in launched]
            try:
                for r in range(args.rounds):
                    for variant in variants if r % 2 == 0 else variants[::-1]:
                        worker_args = ["--worker", "--variant", variant, "--urls", ",".join(urls), "--dtype", args.dtype, "--pushes", str(args.pushes),
                                       "--bucket-mb", str(args.bucket_mb), "--threads", str(args.threads), "--device", "cuda:0" if on_gpus else "cpu",
                                       "--verify-tolerance", str(args.verify_tolerance), *(["--running"] if args.base_url else []),
                                       *(["--weight-dir", args.weight_dir] if args.weight_dir else []),
                                       *(["--master-address", args.master_address] if args.master_address else [])]  # fmt: skip
                        result = run_worker(Path(__file__), worker_args, env={"OMP_NUM_THREADS": str(args.threads)})
                        results.setdefault((variant, n), []).append(result)
                        print(
                            f"  {n} server(s) {variant:22s} round {r}: "
                            + json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in result.items()}),
                            flush=True,
                        )
            finally:
                for server in launched:
                    server.stop()
    print(f"after: {load_note()}")
    params = next(iter(results.values()))[0]["parameters"]
    print(
        f"\n{params / 1e6:.0f}M parameters, {args.dtype}, bucket_mb {args.bucket_mb:g}, {args.rounds} A/B round(s) x {args.pushes} steady push(es)\n"
    )
    print(
        "| servers | weight_sync | seconds per push | first push (s) | trainer peak memory added (MiB) | servers hold the trainer's weights |"
    )
    print("|---|---|---|---|---|---|")
    for (variant, n), runs in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        pushes = [s for run in runs for s in run["push_s"]]
        spread = f" +- {statistics.stdev(pushes):.2f}" if len(pushes) > 1 else ""
        print(
            f"| {n} | {variant} | {statistics.mean(pushes):.2f}{spread} | {statistics.mean(r['first_s'] for r in runs):.2f} | "
            f"{statistics.mean(r['peak_added_mb'] for r in runs):.0f} | {all(r['exact'] for r in runs)} |"
        )
    for n in args.servers:
        timed = {v: [s for run in results[(v, m)] for s in run["push_s"]] for v, m in results if m == n}
        for variant in [v for v in timed if v != "disk" and "disk" in timed]:
            print(
                f"\n{n} server(s): disk / {variant} = {statistics.mean(timed['disk']) / statistics.mean(timed[variant]):.2f}x"
            )
        runs = [run for (v, m), rs in results.items() if m == n for run in rs]
        print(
            f"{n} server(s): verification {statistics.mean(r['verify_s'] for r in runs):.2f} s per push "
            f"(the servers' probe continuations {statistics.mean(r['verify_servers_s'] for r in runs):.2f} s, then the trainer's forward)"
        )


if __name__ == "__main__":
    main()
