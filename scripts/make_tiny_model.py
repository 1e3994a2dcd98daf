"""Build the embedded default policy: a character-level Llama trained (SFT) on builtin:arithmetic
demonstrations from a careless teacher who drops each carry with probability --forget-carry.

    python scripts/make_tiny_model.py          # writes lightning_rl/assets/tiny-arith (~15 min on 2 CPU cores)

The model learns addition *and* the teacher's habit: on problems without a carry it is right, on
problems with one its most likely answer forgets the carry, so its held-out greedy accuracy lands
near the fraction of carry-free problems (~30%), while the right answer is still among its samples.
RL with an exact-match verifier then has something real to repair. The script fails unless the
final accuracy lies in [--low, --high]. The shipped weights came from the defaults below
(--seed 0, one thread: OMP_NUM_THREADS=1); other machines may differ in the last float bits.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch

from lightning_rl.core.models import TINY_MODEL_PATH
from lightning_rl.data.tasks import arithmetic_rows
from lightning_rl.recipes.tiny import build_char_tokenizer, build_tiny_llama, supervised_step


def careless_sum(a: int, b: int, forget: float, rng: random.Random) -> int:
    """Column addition by a teacher who drops each carry with probability ``forget``."""
    total, carry, place = 0, 0, 1
    while a or b or carry:
        column = a % 10 + b % 10 + carry
        total += (column % 10) * place
        carry = int(column >= 10 and rng.random() >= forget)
        a, b, place = a // 10, b // 10, place * 10
    return total


def demonstrations(rows, forget: float, rng: random.Random):
    """SFT targets from the careless teacher (addition only; other operators are answered correctly)."""
    out = []
    for r in rows:
        a, op, b = r["prompt"].rstrip("=").partition("+") if "+" in r["prompt"] else (None, None, None)
        answer = str(careless_sum(int(a), int(b), forget, rng)) if op and forget > 0 else r["answer"]
        out.append({"prompt": r["prompt"], "answer": answer})
    return out


def encode(tokenizer, rows):
    """prompt + answer + <eos>, with labels only on the answer and <eos> (-100 elsewhere)."""
    seqs, labels = [], []
    for r in rows:
        p = tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]
        a = tokenizer(r["answer"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(p + a)
        labels.append([-100] * len(p) + a)
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id)
    lab = torch.full((len(seqs), width), -100)
    for i, (s, target) in enumerate(zip(seqs, labels)):
        ids[i, : len(s)] = torch.tensor(s)
        lab[i, : len(target)] = torch.tensor(target)
    return ids, lab


@torch.no_grad()
def greedy_accuracy(model, tokenizer, rows) -> float:
    tokenizer.padding_side = "left"
    enc = tokenizer([r["prompt"] for r in rows], return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(
        **enc,
        do_sample=False,
        max_new_tokens=6,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return sum(t.strip() == r["answer"] for t, r in zip(texts, rows)) / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=TINY_MODEL_PATH)
    parser.add_argument("--low", type=float, default=0.15, help="required held-out greedy accuracy: at least ...")
    parser.add_argument("--high", type=float, default=0.40, help="... and at most")
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--forget-carry", type=float, default=0.65, help="the teacher drops each carry with this probability"
    )
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--stop-early", action="store_true", help="stop at the first evaluation inside [low, high]")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, seed=args.seed)
    train, test = arithmetic_rows("train"), arithmetic_rows("test")
    train_and_save(model, tokenizer, train, test, demonstrations, args, rng)


def train_and_save(model, tokenizer, train, test, teacher, args, rng: random.Random) -> None:
    """Supervised steps on ``teacher(rows, args.forget_carry, rng)`` until ``args.max_steps`` (or, with
    ``args.stop_early``, the first evaluation inside [low, high]); saves to ``args.out`` only inside that range."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    accuracy = greedy_accuracy(model.eval(), tokenizer, test)
    print(f"step 0: held-out greedy accuracy {accuracy:.3f}", flush=True)
    for step in range(1, args.max_steps + 1):
        ids, labels = encode(tokenizer, teacher(rng.sample(train, args.batch_size), args.forget_carry, rng))
        loss = supervised_step(
            model, optimizer, ids, labels, tokenizer.pad_token_id, step, args.lr, args.warmup, args.max_steps
        )
        if step % args.eval_every == 0:
            accuracy = greedy_accuracy(model.eval(), tokenizer, test)
            print(f"step {step}: loss {loss:.3f}  held-out greedy accuracy {accuracy:.3f}", flush=True)
            if args.stop_early and args.low <= accuracy <= args.high:
                break
    if not args.low <= accuracy <= args.high:
        raise SystemExit(
            f"held-out greedy accuracy {accuracy:.3f} is outside [{args.low}, {args.high}]; change --forget-carry, --max-steps or --lr"
        )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(
        f"saved {sum(p.numel() for p in model.parameters()):,} parameters to {args.out} (held-out greedy accuracy {accuracy:.3f})"
    )


if __name__ == "__main__":
    main()
