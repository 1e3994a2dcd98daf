"""Supervised fine-tuning (SFT) on prompt + completion rows: the warm start every RL run starts from.

    lightning-rl sft --config configs/sft.yaml          # or: python -m lightning_rl.recipes.sft fit --config ...
    lightning-rl sft --config configs/sft.yaml --data.train_data mine.jsonl \\
        --data.val_data mine_test.jsonl --data.columns '{prompt: question, completion: solution}'
    lightning-rl export runs/sft/latest/checkpoints/last.ckpt runs/sft/hf   # policy/: model.policy.path of an RL run

Loss: the cross-entropy of the completion's tokens (then EOS) given the prompt, a mean over the batch's completion
tokens; prompt tokens are context, never targets. The data is the RL runs' `PromptDataModule` (same files, column
mapping, chat template and row checks; the completion is one more column it passes through), the run folders,
console and checkpoints are those of `lightning-rl fit` (`RunCLI`), and a checkpoint exports with `lightning-rl
export` like an RL run's policy. ``val/accuracy``: the fraction of held-out prompts whose greedy completion is the
completion column, stripped (exact match, what `components.reward.ExactMatch` scores in RL).
"""

from __future__ import annotations

from typing import Any

import torch
from lightning import LightningModule
from torch import Tensor

from lightning_rl import checkpoint
from lightning_rl.core.batch import Prompts
from lightning_rl.core.inputs import sequence_inputs
from lightning_rl.core.logprobs import sampled_logprobs
from lightning_rl.core.models import ModelSpec, check_model_path, load_causal_lm, load_tokenizer
from lightning_rl.data.checks import DataError
from lightning_rl.recipes import adamw_with_warmup

__all__ = ["SupervisedFineTuning", "completion_loss", "main"]


def completion_loss(logprobs: Tensor, mask: Tensor) -> Tensor:
    """Negative log-likelihood per completion token, mean over the batch's tokens. Shapes: (B, R), (B, R) -> ()."""
    return -(logprobs * mask).sum() / mask.sum().clamp_min(1)


class SupervisedFineTuning(LightningModule):
    """A causal LM trained to continue each prompt with its completion (loss on the completion tokens only)."""

    def __init__(
        self,
        policy: ModelSpec = ModelSpec(),
        completion_key: str = "completion",
        lr: float = 1e-4,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        max_completion_length: int = 32,
    ):
        """
        Args:
            policy: the model to fine-tune (its tokenizer tokenises the data); the default is the shipped tiny model.
            completion_key: the data column holding each prompt's completion (after ``data.columns``' renaming).
            lr: AdamW learning rate.
            weight_decay: AdamW weight decay.
            warmup_steps: linear learning-rate warmup, in optimizer steps.
            max_completion_length: completion tokens trained on (EOS included; longer completions are cut) and the
                most tokens generated for ``val/accuracy``.
        """
        super().__init__()
        check_model_path(policy.path, "model.policy.path")  # a mistyped path fails here, before any model loads
        self.save_hyperparameters()
        self.policy_spec = policy
        self.policy = None
        self.tokenizer = None

    def configure_model(self) -> None:
        if self.policy is not None:
            return
        self.tokenizer = load_tokenizer(self.policy_spec.path)
        self.policy = load_causal_lm(self.policy_spec)
        self.policy.train()  # transformers loads in eval mode; Lightning switches to eval for validation and back

    def completions(self, prompts: Prompts) -> tuple[Tensor, Tensor]:
        """The completion column's token ids, each ended by EOS, right-padded: ids and mask, each (B, R)."""
        key = self.hparams.completion_key
        if key not in prompts.columns:
            raise DataError(
                f"no {key!r} column in the data (model.completion_key); its columns: {sorted(prompts.columns)}. "
                f"Map yours with data.columns, e.g. '{{prompt: question, {key}: solution}}'"
            )
        tok, limit = self.tokenizer, self.hparams.max_completion_length
        ids = [
            row[: limit - 1] + [tok.eos_token_id]
            for row in tok([str(c) for c in prompts.columns[key]], add_special_tokens=False)["input_ids"]
        ]
        width = max(len(row) for row in ids)
        out = torch.full((len(ids), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, row in enumerate(ids):
            out[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        return out.to(self.device), mask.to(self.device)

    def loss(self, prompts: Prompts) -> tuple[Tensor, int]:
        """`completion_loss` of the batch, and its number of completion tokens."""
        ids, mask = self.completions(prompts)  # (B, R)
        prompt_ids, prompt_mask = prompts.prompt_ids.to(self.device), prompts.prompt_mask.to(self.device)
        input_ids, attention_mask, positions = sequence_inputs(prompt_ids, prompt_mask, ids, mask)
        logits = self.policy(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False
        ).logits
        start = prompt_ids.shape[1]
        logprobs = sampled_logprobs(
            logits[:, start - 1 : -1], ids
        )  # (B, R): each completion token from the position before it
        return completion_loss(logprobs, mask.float()), int(mask.sum())

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        prompts = batch["prompts"]
        loss, tokens = self.loss(prompts)
        self.log("train/loss", loss, prog_bar=True, batch_size=prompts.prompt_ids.shape[0])
        self.log("train/completion_tokens", float(tokens), batch_size=1)
        return loss

    @torch.no_grad()
    def validation_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        prompts = batch["prompts"]
        n = prompts.prompt_ids.shape[0]
        loss, _ = self.loss(prompts)
        self.log("val/loss", loss, batch_size=n, sync_dist=True)
        self.log("val/accuracy", self.greedy_accuracy(prompts), prog_bar=True, batch_size=n, sync_dist=True)

    def greedy_accuracy(self, prompts: Prompts) -> Tensor:
        """The fraction of ``prompts`` whose greedy completion, decoded and stripped, is their completion column's."""
        prompt_ids = prompts.prompt_ids.to(self.device)
        tok = self.tokenizer
        out = self.policy.generate(
            input_ids=prompt_ids,
            attention_mask=prompts.prompt_mask.to(self.device),
            max_new_tokens=self.hparams.max_completion_length,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
        said = tok.batch_decode(out[:, prompt_ids.shape[1] :], skip_special_tokens=True)
        wanted = prompts.columns[self.hparams.completion_key]
        return torch.tensor([s.strip() == str(w).strip() for s, w in zip(said, wanted)], dtype=torch.float32).mean()

    def configure_optimizers(self) -> dict[str, Any]:
        return adamw_with_warmup(
            self.policy.parameters(), self.hparams.lr, self.hparams.weight_decay, self.hparams.warmup_steps
        )

    def configure_callbacks(self) -> list:
        """As RLModule's (lightning_rl.loop.module): the run folders with ``latest``, last.ckpt at the final step and on an
        interrupt, no checkpoint of non-finite weights, validation before the first step and after the last."""
        from lightning_rl.callbacks import FiniteCheckpoints, ResumableCheckpoints, RunFolders, ValidateBeforeAndAfter

        return [RunFolders(), ResumableCheckpoints(), FiniteCheckpoints(), ValidateBeforeAndAfter()]

    def on_save_checkpoint(self, checkpoint_: dict[str, Any]) -> None:
        checkpoint_["hf_export"] = {
            "policy": checkpoint.policy_export_info(self.policy, self.policy_spec)
        }  # `lightning-rl export`


def main(args: list[str] | None = None, run: bool = True, prog: str = "python -m lightning_rl.recipes.sft"):
    """``lightning-rl sft [fit|validate] ...`` and ``python -m lightning_rl.recipes.sft fit|validate ...``: `RunCLI`
    (the run folders, console and checkpoints of `lightning-rl fit`) over `SupervisedFineTuning` and `PromptDataModule`;
    ``prog`` is the command its help and errors name."""
    from lightning_rl.cli.commands import RunCLI, build_cli

    class SFTCLI(RunCLI):
        progress_unit = "optimizer steps"

    return build_cli(
        SFTCLI,
        SupervisedFineTuning,
        prog,
        "Supervised fine-tuning on prompt + completion rows (the warm start of an RL run).",
        args,
        run,
    )


if __name__ == "__main__":
    from lightning_rl.cli.commands import command_line

    command_line(main)
