"""40 requests of 8 MiB sent at once to the agents' endpoint with an episode's key: how much memory the trainer's
process takes and how long the endpoint's event loop stalls, under the default ``max_bytes_in_flight`` (64 MiB) and
with the bound lifted (every body read and parsed at once, as before round five).

    python benchmarks/endpoint_flood.py                      # 40 x 8 MiB, each held 0.5 s by the handler
    python benchmarks/endpoint_flood.py --requests 20 --hold-s 1

Each setting runs in a fresh process (its peak RSS is its own). A request is a chat body of 8 MiB of messages (1,000
of ~8 KiB each); the handler holds each for ``--hold-s`` (a sampler call) then answers. The event loop's stall is the
longest wait of a small authenticated GET /v1/models sent every 20 ms meanwhile. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import RESULT_PREFIX, load_note, run_worker  # noqa: E402


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def worker(n_requests: int, hold_s: float, max_bytes_in_flight: int) -> dict:
    import httpx2 as httpx

    from components.rollout.endpoint.server import Endpoint, EndpointLimits

    endpoint = Endpoint(limits=EndpointLimits(max_bytes_in_flight=max_bytes_in_flight))

    def hold(route: str, request: dict) -> Future:
        future: Future = Future()
        threading.Timer(hold_s, future.set_result, args=((200, {"messages": len(request["messages"])}),)).start()
        return future

    endpoint.open("e", hold)
    message = {"role": "user", "content": "x" * (8 * 2**10 - 40)}
    body = json.dumps({"model": "policy", "messages": [message] * 1000}).encode()
    headers = {"Authorization": f"Bearer {endpoint.token('e')}", "Content-Type": "application/json"}
    url = endpoint.base_url("e")
    baseline = _status_kib("VmRSS")
    statuses: list[int] = []
    lags: list[float] = []
    done = threading.Event()

    def send() -> None:
        with httpx.Client(trust_env=False, timeout=600) as client:
            statuses.append(client.post(url + "/chat/completions", content=body, headers=headers).status_code)

    def probe() -> None:
        with httpx.Client(trust_env=False, timeout=600) as client:
            while not done.is_set():
                start = time.monotonic()
                client.get(url + "/models", headers=headers)
                lags.append(time.monotonic() - start)
                time.sleep(0.02)

    prober = threading.Thread(target=probe)
    prober.start()
    start = time.monotonic()
    senders = [threading.Thread(target=send) for _ in range(n_requests)]
    for thread in senders:
        thread.start()
    for thread in senders:
        thread.join()
    seconds = time.monotonic() - start
    done.set()
    prober.join()
    endpoint.close()
    return {
        "body_mib": len(body) / 2**20,
        "statuses": sorted(set(statuses)),
        "seconds": seconds,
        "peak_rss_over_baseline_mib": (_status_kib("VmHWM") - baseline) / 1024,
        "longest_probe_s": max(lags, default=0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--hold-s", type=float, default=0.5)
    parser.add_argument("--worker", nargs=3, type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        n, hold_s, max_bytes = args.worker
        print(RESULT_PREFIX + json.dumps(worker(int(n), hold_s, int(max_bytes))), flush=True)
        return
    print(load_note())
    for name, max_bytes in (("max_bytes_in_flight 64 MiB (default)", 64 * 2**20), ("no bound (1 TiB)", 2**40)):
        result = run_worker(Path(__file__), ["--worker", str(args.requests), str(args.hold_s), str(max_bytes)])
        print(
            f"{name}: {args.requests} x {result['body_mib']:.1f} MiB, answers {result['statuses']}, "
            f"{result['seconds']:.1f} s, peak RSS +{result['peak_rss_over_baseline_mib']:.0f} MiB, "
            f"longest /v1/models wait {result['longest_probe_s']:.2f} s",
            flush=True,
        )
    print(load_note())


if __name__ == "__main__":
    main()
