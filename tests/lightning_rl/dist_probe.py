"""Test-only parts for runs compared across world sizes (importable by dotted path from the CLI).

``SeededRollout`` samples each prompt with a seed taken from its token ids, so one process and two
processes draw identical responses for the same prompts: the global batch is then the same, and any
difference in loss or parameters comes from the distributed reductions under test.
``Probe`` writes what a test compares (full parameters and buffers, logged losses, the optimizer
state, a rollout with unequal lengths across ranks) to a file on rank 0.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from lightning import Callback

from components.rollout import HFRollout
from lightning_rl.core.batch import Prompts, RolloutBatch
from lightning_rl.distributed import trainable_state_dict
from tests.helpers import prompts


class SeededRollout(HFRollout):
    """HFRollout, one prompt at a time (padding stripped), with the RNG seeded from the prompt's tokens."""

    def generate(self, prompts: Prompts, policy, params=None) -> RolloutBatch:
        parts = []
        for row, (ids, mask) in enumerate(zip(prompts.prompt_ids, prompts.prompt_mask)):
            ids = ids[mask.bool()][None]  # (1, P_i)
            torch.manual_seed(1000 + sum(int(t) * 31**i for i, t in enumerate(ids[0].tolist())) % 100_000)
            one = Prompts(ids, torch.ones_like(ids), {k: [v[row]] for k, v in prompts.columns.items()})
            parts.append(super().generate(one, policy, params))
        batch = RolloutBatch.cat(parts)
        rows = parts[0].batch_size
        return batch.replace(
            group_ids=torch.arange(len(parts), device=prompts.prompt_ids.device).repeat_interleave(rows)
        )


class Probe(Callback):
    """Records, after every iteration, the losses the module logged; at the end of fit, the full state."""

    def __init__(self, out: str, generate_lengths: bool = False, policy_snapshots: bool = False):
        """
        Args:
            out: file for ``torch.save`` (written by global rank 0).
            generate_lengths: at the end, sample 1 new token on rank 0 and 5 on rank 1 with `HFRollout`: unequal
                step counts, which only complete when ranks keep stepping together on a sharded policy.
            policy_snapshots: also keep the policy's parameters after each iteration (unsharded strategies).
        """
        self.out, self.generate_lengths, self.policy_snapshots = out, generate_lengths, policy_snapshots
        self.losses: list[float] = []
        self.rewards: list[float] = []
        self.snapshots: list[dict[str, torch.Tensor]] = []

    def on_train_start(self, trainer, module) -> None:
        if self.policy_snapshots:
            self.snapshots.append({n: p.detach().clone() for n, p in module.policy.named_parameters()})

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        logged = trainer.logged_metrics
        self.losses.append(float(logged["policy/loss"]) if "policy/loss" in logged else float("nan"))
        self.rewards.append(float(logged["reward/mean"]))
        if self.policy_snapshots:
            self.snapshots.append({n: p.detach().clone() for n, p in module.policy.named_parameters()})

    def on_fit_end(self, trainer, module) -> None:
        state = trainable_state_dict(trainer, module)
        from torch.distributed.fsdp import FSDPModule

        record = {
            "state": state,
            "losses": self.losses,
            "rewards": self.rewards,
            "world_size": trainer.world_size,
            "snapshots": self.snapshots,
        }
        scorer = getattr(module.reward, "model", None)  # RewardModel's classifier; its backbone is the sharded unit
        reward = getattr(scorer, getattr(scorer, "base_model_prefix", ""), None)
        roots = {"policy": module.policy, "reference": module.reference, "critic": module.critic, "reward": reward}
        roots["teacher"] = getattr(module.teacher, "shard_unit", None)
        record["sharded"] = sorted(name for name, m in roots.items() if isinstance(m, FSDPModule))
        if self.generate_lengths:
            # greedy, 5 new tokens at most: rank 0 stops after its first token (every id is a stop token), rank 1 never
            # stops early; each sharded forward is a collective, so rank 0 must keep stepping until rank 1 is done
            rollout = HFRollout(
                group_size=1,
                max_new_tokens=5,
                stop_token_ids=list(range(module.policy.config.vocab_size)) if trainer.global_rank == 0 else [],
            )
            rollout.setup(module.tokenizer)
            if trainer.global_rank > 0:
                rollout.eos_token_id = -1
            ids = torch.tensor([[5, 6, 7]], device=module.device)
            out = rollout.generate(
                prompts(ids, torch.ones_like(ids)), module.policy, replace(rollout.params, greedy=True)
            )
            lengths = [torch.zeros((), dtype=torch.long) for _ in range(trainer.world_size)]
            torch.distributed.all_gather(lengths, torch.tensor(out.response_ids.shape[1]))
            record["generated_lengths"] = [int(n) for n in lengths]
            record["fsdp_managed"] = bool(getattr(module.policy, "_is_fsdp_managed_module", False))
        if trainer.is_global_zero:
            torch.save(record, self.out)
        trainer.strategy.barrier()


if __name__ == "__main__":
    # `python -m tests.lightning_rl.dist_probe fit ...`: the CLI, then a prompt exit (Lightning's launcher
    # re-runs this same command for the other ranks). Interpreter shutdown with a live gloo group takes
    # ~10 s of garbage collection on this machine; the result is on disk by then.
    import os
    import sys

    from lightning_rl.cli import main

    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
