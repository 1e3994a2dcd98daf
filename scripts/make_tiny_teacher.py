"""Build the shipped distillation teacher for the built-in arithmetic task: a character-level Qwen2 (another
architecture than the Llama student, lightning_rl/assets/tiny-arith, and half its width per attention head group:
grouped-query attention) trained on builtin:arithmetic's correct answers, stored in bfloat16.

    OMP_NUM_THREADS=1 python scripts/make_tiny_teacher.py      # writes lightning_rl/assets/tiny-arith-teacher

The student learnt from a careless teacher who drops carries (scripts/make_tiny_model.py); this one learns from an
exact one (--forget-carry 0), on the same train split, so its held-out greedy accuracy is high and it knows what the
student gets wrong. It shares the student's tokenizer (the same character vocabulary, token for token): a teacher
scores the student's token ids as they are. Weights are saved in bfloat16 (half the bytes; the teacher runs in its
own precision, ``model.teacher.init_args.dtype``), and the script fails unless the bfloat16 model's held-out greedy
accuracy lies in [--low, --high]. The shipped weights came from the defaults below with one thread.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch
from make_tiny_model import demonstrations, greedy_accuracy, train_and_save  # scripts/make_tiny_model.py, beside this

from lightning_rl.data.tasks import arithmetic_rows
from lightning_rl.recipes.tiny import build_char_tokenizer

OUT = Path(__file__).resolve().parents[1] / "lightning_rl" / "assets" / "tiny-arith-teacher"


def build_tiny_qwen2(tokenizer, hidden_size: int, layers: int, heads: int, kv_heads: int, seed: int):
    """A randomly initialised Qwen2 (biased q/k/v projections, grouped-query attention) for the character vocabulary."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=3 * hidden_size,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=64,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, use_sliding_window=False,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument(
        "--low", type=float, default=0.97, help="required held-out greedy accuracy (bfloat16): at least ..."
    )
    parser.add_argument("--high", type=float, default=1.0, help="... and at most")
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=2500)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stop-early", action="store_true", help="stop at the first evaluation inside [low, high]")
    args = parser.parse_args()
    args.forget_carry = 0.0  # an exact teacher: every carry kept

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = build_char_tokenizer()
    model = build_tiny_qwen2(tokenizer, args.hidden_size, args.layers, args.heads, args.kv_heads, args.seed)
    train, test = arithmetic_rows("train"), arithmetic_rows("test")
    train_and_save(model, tokenizer, train, test, demonstrations, args, rng)
    from transformers import AutoModelForCausalLM

    # stored in bfloat16; the accuracy that counts is the stored model's
    half = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.bfloat16)
    half.save_pretrained(args.out)
    accuracy = greedy_accuracy(
        AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.bfloat16).eval(), tokenizer, test
    )
    print(f"bfloat16 weights in {args.out}: held-out greedy accuracy {accuracy:.3f}")
    if not args.low <= accuracy <= args.high:
        raise SystemExit(
            f"the bfloat16 teacher's held-out greedy accuracy {accuracy:.3f} is outside [{args.low}, {args.high}]"
        )


if __name__ == "__main__":
    main()
