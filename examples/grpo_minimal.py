"""GRPO in one file: the phases of an RL iteration written out inline, on the same components RLModule composes.

    python examples/grpo_minimal.py                  # 60 iterations on the built-in arithmetic task, on CPU
    python examples/grpo_minimal.py --iterations 200 --batch-size 16

Read this to see what `lightning-rl fit --config configs/grpo.yaml` does in each iteration, without Lightning:

    1 collect    the rollout samples G responses per prompt; the reward scores each one
    2 score      (on-policy: pi_old is the policy itself, so no separate forward pass is needed)
    3 estimate   the score sits on each response's last token; GRPO's advantage is the group-normalised score
    4 optimize   one epoch, one mini-batch: clipped surrogate, token-mean over the batch, clip the gradient, step
    5 sync       the sampler samples from the policy itself: nothing to push

What RLModule adds on top is plumbing, not math: micro-batches and token budgets, several epochs and
mini-batches, critics and reference models, data-parallel and sharded strategies, asynchronous rounds,
checkpoints, validation, logging. With the same settings (and one micro-batch) both train the same
parameters, bit for bit (tests/examples/test_grpo_minimal.py).
"""

from __future__ import annotations

import argparse

import torch

from components.advantage import GroupNormalized
from components.aggregator import TokenMean
from components.reward import ExactMatch
from components.rollout import HFRollout
from components.surrogate import ClippedSurrogate
from lightning_rl.core.batch import terminal_rewards
from lightning_rl.core.logprobs import policy_logprobs
from lightning_rl.core.models import TINY_MODEL_PATH, ModelSpec, load_causal_lm, load_tokenizer
from lightning_rl.data import PromptDataModule


def train(
    iterations: int = 60,
    batch_size: int = 16,
    group_size: int = 8,
    max_new_tokens: int = 8,
    lr: float = 1e-4,
    max_grad_norm: float = 1.0,
    seed: int = 0,
    policy_path: str = TINY_MODEL_PATH,
    log=print,
) -> torch.nn.Module:
    """Train the policy at ``policy_path`` with GRPO on ``builtin:arithmetic``; returns the trained policy."""
    tokenizer = load_tokenizer(policy_path)
    policy = load_causal_lm(ModelSpec(path=policy_path))
    data = PromptDataModule(
        train_data="builtin:arithmetic", val_data=None, tokenizer=policy_path, batch_size=batch_size
    )
    data.setup("fit")
    prompt_batches = iter(data.train_dataloader())  # an endless, seeded stream of prompt batches

    rollout = HFRollout(group_size=group_size, max_new_tokens=max_new_tokens, temperature=1.0)
    rollout.setup(tokenizer)
    reward = ExactMatch(answer_key="answer")
    advantage = GroupNormalized(scale="group")  # (R - mean_group) / std_group, on every token of the response
    surrogate = ClippedSurrogate(eps_low=0.2, eps_high=0.2)
    aggregator = TokenMean()
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=True)
    temperature = rollout.params.temperature

    torch.manual_seed(seed)  # sampling draws from torch's global random stream
    for iteration in range(iterations):
        # 1 collect: B = batch_size * G responses, each prompt's G rows contiguous and sharing a group id
        prompts = next(prompt_batches)["prompts"]
        with torch.no_grad():
            batch = rollout.generate(prompts, policy)
        lengths = batch.response_lengths.tolist()
        completions = tokenizer.batch_decode(
            [ids[:n] for ids, n in zip(batch.response_ids.tolist(), lengths)], skip_special_tokens=True
        )
        batch = batch.with_columns(completions=completions)  # the reward reads them beside the data's `answer` column
        batch = batch.replace(scores=reward.score(batch).total, sample_mask=torch.ones(batch.batch_size))  # (B,)

        # 3 estimate: rewards on each response's last token, then the group-relative advantage (B, R)
        batch = batch.replace(token_rewards=terminal_rewards(batch.scores, batch.action_tokens))
        advantages, _ = advantage(batch)
        batch = batch.replace(advantages=advantages)
        if not bool((advantages.abs() * batch.loss_mask).sum() > 0):
            log(f"iteration {iteration}: every group scored alike, nothing to learn; update skipped")
            continue

        # 4 optimize: on-policy, so pi_old = pi_theta (ratio 1, gradient of the plain policy gradient)
        logprobs, _ = policy_logprobs(policy, batch, temperature)  # (B, R), gradients flow
        batch = batch.replace(old_logprobs=logprobs.detach())
        per_token, metrics = surrogate(logprobs, batch)  # (B, R) unreduced
        loss = aggregator(per_token, batch.loss_mask, aggregator.denominator(batch.loss_mask))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        # 5 sync: HFRollout samples from `policy` itself; a server-backed rollout would push the weights here
        log(
            f"iteration {iteration}: reward {float(batch.scores.mean()):.3f}, clip fraction {float(metrics['policy/clipfrac']):.3f}"
        )
    return policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per iteration")
    parser.add_argument("--group-size", type=int, default=8, help="responses per prompt (G)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    train(args.iterations, args.batch_size, args.group_size, lr=args.lr, seed=args.seed)


if __name__ == "__main__":
    main()
