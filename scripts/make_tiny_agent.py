"""Build the tiny tool-using policy of the agent task: a character-level Llama trained (SFT) on builtin:calc
demonstrations from a teacher who sometimes uses the calculator and sometimes guesses.

    python scripts/make_tiny_agent.py        # writes lightning_rl/assets/tiny-calc (a few minutes on 2 CPU cores)

A demonstration is either a tool episode,

    123*45=  <call>123*45</call>  <result>5535</result>  5535<eos>     (the result is the environment's)

or a guess in the head, ``5000<eos>`` (the operands rounded to their leading digit: almost never right).
The teacher calls the calculator with probability --p-call-high on problems whose first operand is 700
or more and --p-call-low on the others, so the model's greedy choice is to call on about a third of the
problems: its held-out greedy accuracy starts near 30%, while sampling still calls the tool on the other
problems now and then. RL (configs/agent_calc.yaml) has something to find: calling always pays.
Observation tokens carry no loss, as in RL. The script fails unless the final greedy accuracy, measured
through the same multi-turn rollout RL uses, lies in [--low, --high].
"""

from __future__ import annotations

import argparse
import random
from dataclasses import replace
from pathlib import Path

import torch

from components.env import Calculator, ToolEnvironment
from components.rollout import HFRollout, MultiTurnRollout
from lightning_rl.core.batch import Prompts
from lightning_rl.data.tasks import calc_rows
from lightning_rl.recipes.tiny import TOOL_TAGS, build_char_tokenizer, build_tiny_llama, supervised_step

OUT = Path(__file__).resolve().parents[1] / "lightning_rl" / "assets" / "tiny-calc"


def guess(a: int, b: int) -> int:
    """A guess in the head: each operand rounded to its leading digit."""
    lead = lambda x: round(x, -(len(str(x)) - 1))  # noqa: E731
    return lead(a) * lead(b)


def demonstration(tokenizer, row: dict, p_call: float, rng: random.Random) -> tuple[list[int], list[int]]:
    """(ids, labels) of prompt + episode: labels only on the model's tokens (-100 on prompt and observation)."""
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    a, b = (int(x) for x in row["prompt"].rstrip("=").split("*"))
    prompt = enc(row["prompt"])
    if rng.random() < p_call:
        call = enc(f"<call>{a}*{b}</call>")
        observation = enc(f"<result>{a * b}</result>")
        answer = enc(str(a * b)) + [tokenizer.eos_token_id]
        return prompt + call + observation + answer, [-100] * len(prompt) + call + [-100] * len(observation) + answer
    answer = enc(str(guess(a, b))) + [tokenizer.eos_token_id]
    return prompt + answer, [-100] * len(prompt) + answer


def batch(tokenizer, rows, p_high: float, p_low: float, rng: random.Random):
    pairs = [demonstration(tokenizer, r, p_high if r["prompt"][0] in "789" else p_low, rng) for r in rows]
    width = max(len(ids) for ids, _ in pairs)
    ids = torch.full((len(pairs), width), tokenizer.pad_token_id)
    labels = torch.full((len(pairs), width), -100)
    for i, (s, answer) in enumerate(pairs):
        ids[i, : len(s)], labels[i, : len(answer)] = torch.tensor(s), torch.tensor(answer)
    return ids, labels


def calc_agent(tokenizer, max_new_tokens: int = 10):
    """The environment and rollout of configs/agent_calc.yaml, for greedy evaluation."""
    sampler = HFRollout(group_size=1, max_new_tokens=max_new_tokens, temperature=0.0)
    sampler.setup(tokenizer)
    agent = MultiTurnRollout(ToolEnvironment([Calculator()], default_tool="calc"), max_turns=3, max_total_tokens=40)
    agent.setup(tokenizer, sampler)
    return sampler, agent


@torch.no_grad()
def greedy_accuracy(model, tokenizer, rows) -> tuple[float, float]:
    """Held-out greedy accuracy and tool calls per problem, through the multi-turn rollout."""
    sampler, agent = calc_agent(tokenizer)
    enc = tokenizer([r["prompt"] for r in rows], return_tensors="pt", padding=True, add_special_tokens=False)
    prompts = Prompts(enc.input_ids, enc.attention_mask, {k: [r[k] for r in rows] for k in rows[0]})
    batch, metrics = agent.generate(sampler, prompts, model, replace(sampler.params, greedy=True))
    accuracy = sum(c.strip() == r["answer"] for c, r in zip(batch.columns["completions"], rows)) / len(rows)
    return accuracy, float(metrics["agent/tool_calls_mean"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--low", type=float, default=0.15, help="required held-out greedy accuracy: at least ...")
    parser.add_argument("--high", type=float, default=0.40, help="... and at most")
    parser.add_argument("--max-steps", type=int, default=1500)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--p-call-high", type=float, default=0.85, help="P(call) when the first operand is >= 700")
    parser.add_argument("--p-call-low", type=float, default=0.15, help="P(call) otherwise")
    parser.add_argument("--warmup", type=int, default=100)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = build_char_tokenizer(TOOL_TAGS)
    model = build_tiny_llama(tokenizer, hidden_size=64, layers=2, heads=4, seed=args.seed, max_positions=64)
    train, test = calc_rows("train"), calc_rows("test")[:200]
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    accuracy = calls = 0.0
    for step in range(1, args.max_steps + 1):
        ids, labels = batch(tokenizer, rng.sample(train, args.batch_size), args.p_call_high, args.p_call_low, rng)
        loss = supervised_step(
            model, optimizer, ids, labels, tokenizer.pad_token_id, step, args.lr, args.warmup, args.max_steps
        )
        if step % args.eval_every == 0 or step == args.max_steps:
            accuracy, calls = greedy_accuracy(model.eval(), tokenizer, test)
            print(
                f"step {step}: loss {loss:.3f}  held-out greedy accuracy {accuracy:.3f}  tool calls {calls:.2f}",
                flush=True,
            )
    if not args.low <= accuracy <= args.high:
        raise SystemExit(
            f"held-out greedy accuracy {accuracy:.3f} is outside [{args.low}, {args.high}]; change --p-call-high/low, --max-steps or --lr"
        )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(
        f"saved {sum(p.numel() for p in model.parameters()):,} parameters to {args.out} (held-out greedy accuracy {accuracy:.3f}, tool calls {calls:.2f})"
    )


if __name__ == "__main__":
    main()
