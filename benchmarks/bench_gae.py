"""GAE of a (B, T) batch: ``components.advantage.GAE`` against the plain per-step recurrence.

    python benchmarks/bench_gae.py                    # B = 64, T = 4096, decoupled lambdas 0.95 / 1.0
    python benchmarks/bench_gae.py --batch 256 --length 1024 --repeats 20

The reference is the loop every RL codebase writes (seeds ch. 6.9, CleanRL): one Python step per
token, vectorised over the batch, in the engine's conventions (terminal state after the last valid
token, padding ignored):

    A_t = delta_t + gamma lam m_{t+1} A_{t+1},   delta_t = m_t (r_t + gamma m_{t+1} V_{t+1} - V_t)

Exactness: both fp32 results are compared with the same recurrence run in float64 (the exact
value); the check is |x - x64| <= 1e-5 + 1e-5 |x64| elementwise for the advantages (lambda_actor)
and the returns (lambda_critic, plus V). Inputs look like PPO-RLHF's: random lengths 1..T (prefix
masks), a terminal score in [-1, 1] plus a per-token KL penalty of -0.05 * k1 with k1 ~ N(0, 0.1),
values ~ N(0, 1), all zero on padding (as the module writes them).

Timing: the two implementations alternate A/B/A/B ``--repeats`` times in this one process; the
median of each is reported and their ratio. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks._common import load_note  # noqa: E402


def reference_gae(rewards, values, mask, gamma: float, lam: float):
    """The plain per-step recurrence, vectorised over the batch. Shapes: (B, T) x 3 -> (B, T) advantages, returns."""
    b, t_len = rewards.shape
    advantages = torch.zeros_like(rewards)
    last = torch.zeros(b, dtype=rewards.dtype)
    zero = torch.zeros(b, dtype=rewards.dtype)
    for t in reversed(range(t_len)):
        next_m = mask[:, t + 1] if t + 1 < t_len else zero
        next_v = values[:, t + 1] * next_m if t + 1 < t_len else zero
        delta = (rewards[:, t] + gamma * next_v - values[:, t]) * mask[:, t]
        last = delta + gamma * lam * next_m * last
        advantages[:, t] = last
    return advantages * mask, (advantages + values) * mask


def make_batch(b: int, t_len: int, seed: int):
    """A RolloutBatch with token_rewards, values and a prefix response_mask of random lengths 1..T."""
    from lightning_rl.core.batch import RolloutBatch, terminal_rewards

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t_len + 1, (b,), generator=g)
    lengths[0] = t_len  # at least one full-length row
    mask = (torch.arange(t_len)[None, :] < lengths[:, None]).float()  # (B, T)
    scores = torch.rand(b, generator=g) * 2 - 1
    kl = torch.randn(b, t_len, generator=g) * 0.1
    rewards = (terminal_rewards(scores, mask) - 0.05 * kl) * mask
    values = torch.randn(b, t_len, generator=g) * mask
    ids = torch.zeros(b, t_len, dtype=torch.long)
    return RolloutBatch(response_ids=ids, response_mask=mask.long(), token_rewards=rewards, values=values)


def max_violation(x, exact) -> float:
    """max over elements of |x - exact| / (1e-5 + 1e-5 |exact|): <= 1 means within tolerance."""
    return float(((x.double() - exact).abs() / (1e-5 + 1e-5 * exact.abs())).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--gamma", type=float, default=1.0)
    parser.add_argument("--lam-actor", type=float, default=0.95)
    parser.add_argument("--lam-critic", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: the cores are often shared)")
    args = parser.parse_args()

    from components.advantage import GAE

    torch.set_num_threads(args.threads)
    print(f"before: {load_note()}")
    batch = make_batch(args.batch, args.length, seed=0)
    estimator = GAE(gamma=args.gamma, lam_actor=args.lam_actor, lam_critic=args.lam_critic)
    r, v, m = batch.token_rewards, batch.values, batch.response_mask.float()

    def ours():
        return estimator(batch)

    def reference():
        adv, _ = reference_gae(r, v, m, args.gamma, args.lam_actor)
        _, ret = reference_gae(r, v, m, args.gamma, args.lam_critic)
        return adv, ret

    exact_adv, _ = reference_gae(r.double(), v.double(), m.double(), args.gamma, args.lam_actor)
    _, exact_ret = reference_gae(r.double(), v.double(), m.double(), args.gamma, args.lam_critic)
    got, ref = ours(), reference()
    checks = {
        "GAE advantages": max_violation(got.advantages, exact_adv),
        "GAE returns": max_violation(got.returns, exact_ret),
        "fp32 loop advantages": max_violation(ref[0], exact_adv),
        "fp32 loop returns": max_violation(ref[1], exact_ret),
    }
    times: dict[str, list[float]] = {"reference": [], "GAE": []}
    for _ in range(args.repeats):  # A/B/A/B
        for name, fn in (("reference", reference), ("GAE", ours)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    print(f"after: {load_note()}\n")
    ref_s, ours_s = statistics.median(times["reference"]), statistics.median(times["GAE"])
    print(f"GAE, B = {args.batch}, T = {args.length}, gamma {args.gamma}, lambda actor {args.lam_actor} / critic {args.lam_critic}, "
          f"{args.threads} thread(s), median of {args.repeats}")  # fmt: skip
    print("| | ms | speed-up |\n|---|---|---|")
    print(f"| per-step recurrence (advantages + returns) | {1000 * ref_s:.1f} | 1.0x |")
    print(f"| components.advantage.GAE | {1000 * ours_s:.1f} | {ref_s / ours_s:.1f}x |")
    print("\nexactness against the float64 recurrence (max |x - x64| / (1e-5 + 1e-5 |x64|), pass <= 1):")
    for name, value in checks.items():
        print(f"  {name}: {value:.3f} {'ok' if value <= 1 else 'FAIL'}")
    if checks["GAE advantages"] > 1 or checks["GAE returns"] > 1:
        sys.exit(1)


if __name__ == "__main__":
    main()
