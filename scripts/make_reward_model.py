"""Build the reward model of the built-in arithmetic task offline (Bradley-Terry on correct vs wrong answers).

    python scripts/make_reward_model.py                             # from the shipped tiny policy -> lightning_rl/assets/tiny-arith-rm
    python scripts/make_reward_model.py --init random --out /tmp/rm # from a random tiny Llama
    python scripts/make_reward_model.py --policy lightning_rl/assets/tiny-arith   # also rank that policy's own samples

Pairs: every training problem's correct answer against one wrong answer (near misses, digit
slips, random numbers: `lightning_rl.recipes.reward_model.arithmetic_pairs`); held-out pairs come from the
RL task's test split. Reports held-out pair accuracy before and after training, the time taken,
and with ``--policy`` how often the reward model ranks the policy's correct samples above its
wrong ones on held-out prompts (what PPO-RLHF actually relies on). Deterministic on CPU for a seed.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from lightning import Callback, Trainer, seed_everything

from components.reward.model import TINY_REWARD_MODEL_PATH, RewardModel
from lightning_rl.core.models import TINY_MODEL_PATH, ModelSpec, load_causal_lm, load_tokenizer
from lightning_rl.data.tasks import arithmetic_rows
from lightning_rl.recipes.reward_model import BradleyTerryRewardModel, PairDataModule
from lightning_rl.recipes.tiny import build_char_tokenizer, build_tiny_llama


def random_init(directory: str, seed: int) -> str:
    """A random tiny Llama of the shipped policy's size, saved as a causal LM to start from."""
    tokenizer = build_char_tokenizer()
    build_tiny_llama(tokenizer, seed=seed).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


class PrintAccuracy(Callback):
    def on_validation_end(self, trainer, module) -> None:
        print(
            f"step {trainer.global_step}: held-out pair accuracy {float(trainer.callback_metrics['val/accuracy']):.3f}",
            flush=True,
        )


@torch.no_grad()
def rank_policy_samples(rm_path: str, policy_path: str, n_prompts: int, samples: int, seed: int) -> dict[str, float]:
    """Sample the policy on held-out prompts; how well does the RM separate its correct and wrong answers?"""
    from components.rollout import HFRollout
    from lightning_rl.data.prompts import collate_prompts

    torch.manual_seed(seed)
    tokenizer = load_tokenizer(policy_path)
    policy = load_causal_lm(ModelSpec(path=policy_path)).eval()
    rollout = HFRollout(group_size=samples, max_new_tokens=8, temperature=1.0)
    rollout.setup(tokenizer)
    reward = RewardModel(path=rm_path, batch_size=256)
    reward.setup(tokenizer)
    rows = arithmetic_rows("test")[:n_prompts]
    prompts = collate_prompts(
        [{"input_ids": tokenizer(r["prompt"])["input_ids"]} for r in rows], tokenizer.pad_token_id
    )["prompts"]
    batch = rollout.generate(prompts, policy)
    scores = reward(batch)
    lengths = batch.response_lengths.tolist()
    texts = tokenizer.batch_decode(
        [ids[:n] for ids, n in zip(batch.response_ids.tolist(), lengths)], skip_special_tokens=True
    )
    correct = torch.tensor([t.strip() == rows[i // samples]["answer"] for i, t in enumerate(texts)])
    won = ties = total = 0.0
    for g in range(len(rows)):  # pairs (correct, wrong) within a prompt's samples
        s, c = scores[g * samples : (g + 1) * samples], correct[g * samples : (g + 1) * samples]
        diff = s[c][:, None] - s[~c][None, :]
        won, ties, total = won + float((diff > 0).sum()), ties + float((diff == 0).sum()), total + diff.numel()
    return {
        "policy_sample_accuracy": float(correct.float().mean()),
        "rm_ranks_policy_pairs": (won + 0.5 * ties) / max(total, 1.0),
        "policy_pairs": total,
        "score_correct_mean": float(scores[correct].mean()) if correct.any() else float("nan"),
        "score_wrong_mean": float(scores[~correct].mean()) if (~correct).any() else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init", default=TINY_MODEL_PATH, help="a causal LM to start from, or 'random'")
    parser.add_argument("--out", default=TINY_REWARD_MODEL_PATH)
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument(
        "--policy", default=None, help="also report how the RM ranks this policy's own held-out samples"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    seed_everything(args.seed)
    start = time.time()
    with tempfile.TemporaryDirectory() as scratch:
        init = random_init(scratch, args.seed) if args.init == "random" else args.init
        module = BradleyTerryRewardModel(path=init, lr=args.lr, warmup_steps=args.warmup_steps, output_dir=args.out)
        data = PairDataModule(tokenizer=init, batch_size=args.batch_size, val_batch_size=500, seed=args.seed)
        trainer = Trainer(
            max_steps=args.max_steps, val_check_interval=args.eval_every, check_val_every_n_epoch=None, num_sanity_val_steps=0,
            logger=False, callbacks=[PrintAccuracy()], enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False, deterministic=True,
        )  # fmt: skip
        before = trainer.validate(module, datamodule=data, verbose=False)[0]["val/accuracy"]
        trainer.fit(module, datamodule=data)
        after = float(trainer.callback_metrics["val/accuracy"])
    seconds = time.time() - start
    n_params = sum(p.numel() for p in module.model.parameters())
    size = sum(f.stat().st_size for f in Path(args.out).iterdir())
    print(f"held-out pair accuracy: {before:.3f} before, {after:.3f} after {args.max_steps} steps ({seconds:.0f} s)")
    print(f"saved {n_params:,} parameters ({size / 1e6:.2f} MB on disk) to {args.out}")
    if args.policy:
        for key, value in rank_policy_samples(args.out, args.policy, n_prompts=200, samples=8, seed=args.seed).items():
            print(f"{key}: {value:.3f}")


if __name__ == "__main__":
    main()
