"""Build the tiny policy of the reasoning-gym example: the shipped arithmetic policy (lightning_rl/assets/tiny-arith)
warm-started on reasoning-gym's basic_arithmetic questions ("Calculate 65 + 22.", both terms drawn from 0..100) from
the same careless teacher, who drops each carry with probability --forget-carry.

    OMP_NUM_THREADS=1 python scripts/make_tiny_reasoning_gym.py   # writes lightning_rl/assets/tiny-rg (1400 steps: ~10 min)

The shipped weights came from these defaults with one thread (OMP_NUM_THREADS=1; on two CPU cores shared with other
work, torch's default two threads made each step ~10x slower); held-out greedy accuracy 0.208 on the 500 test questions.

The tokenizer is tiny-arith's with one token more per new character of the questions (their ids come after the
old ones, so every trained embedding keeps its row). After 1400 steps (or, with --stop-early, at the first evaluation)
its held-out greedy accuracy lies in [--low, --high]: the model answers in the task's format and gets some sums
right, and RL with the task's own scorer (configs/reasoning_gym.yaml)
takes it further. The script fails unless the final held-out accuracy lies in [--low, --high].
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch
from make_tiny_model import careless_sum, train_and_save  # scripts/make_tiny_model.py, beside this one

from lightning_rl.core.models import TINY_MODEL_PATH
from lightning_rl.data.sources import load_rows
from lightning_rl.recipes.tiny import CHARS, build_char_tokenizer

OUT = Path(__file__).resolve().parents[1] / "lightning_rl" / "assets" / "tiny-rg"
TASK = "reasoning_gym:basic_arithmetic?min_terms=2&max_terms=2&min_digits=2&max_digits=2&operators=+&allow_parentheses=false&allow_negation=false"
"""The task configs/reasoning_gym.yaml trains on: a + b, each term drawn from 0..100 (reasoning-gym's num_digits=2 draws
randint(0, 100)), as reasoning-gym words it ("Calculate 65 + 22."; its whitespace setting applies only with
parentheses). min_digits=2: with max_digits=2 alone, half the terms are single digits, only ~100 distinct 1-digit
sums exist, and the 500 held-out questions take most of them out of the train split."""


def demonstrations(rows, forget: float, rng: random.Random) -> list[dict]:
    """ "Calculate a + b." answered by the careless teacher."""
    out = []
    for row in rows:
        a, b = (int(x) for x in row["prompt"].removeprefix("Calculate ").rstrip(".").split("+"))
        out.append({"prompt": row["prompt"], "answer": str(careless_sum(a, b, forget, rng))})
    return out


def main() -> None:
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--low", type=float, default=0.15, help="required held-out greedy accuracy: at least ...")
    parser.add_argument("--high", type=float, default=0.35, help="... and at most")
    parser.add_argument("--max-steps", type=int, default=1400)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--forget-carry", type=float, default=0.65, help="the teacher drops each carry with this probability"
    )
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--stop-early", action="store_true", help="stop at the first evaluation inside [low, high]")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    train, test = list(load_rows(TASK, "train")), list(load_rows(TASK, "test"))
    new = sorted({c for row in train + test for c in row["prompt"]} - set(CHARS))
    tokenizer = build_char_tokenizer(tags=new)  # tiny-arith's vocabulary, then one token per new character
    model = AutoModelForCausalLM.from_pretrained(TINY_MODEL_PATH)
    model.resize_token_embeddings(len(tokenizer))
    train_and_save(model, tokenizer, train, test, demonstrations, args, rng)


if __name__ == "__main__":
    main()
