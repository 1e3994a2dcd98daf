"""Train the reward model PPO-RLHF needs, from preference pairs (Bradley-Terry).

    lightning-rl reward-model --config configs/reward_model.yaml   # or: python -m lightning_rl.recipes.reward_model fit ...
    lightning-rl reward-model --config configs/reward_model.yaml --data.train_data prefs.jsonl \\
        --data.val_data prefs_test.jsonl --data.columns '{prompt: question, chosen: good, rejected: bad}'

Loss (Ouyang et al. 2022, arXiv:2203.02155, eq. 1, one pair at a time instead of all K-choose-2
pairs of a prompt in one batch):  -log sigmoid(r(x, y_c) - r(x, y_r)).  The score is read at the
last token of prompt + response (+ EOS), exactly as `components.reward.RewardModel` reads it in
RL (same function). ``val/accuracy`` is the fraction of held-out pairs with r(x, y_c) > r(x, y_r).
At the end of ``fit`` the model is written to ``output_dir`` with ``save_pretrained`` (plus the
tokenizer), ready for ``model.reward.init_args.path``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning import LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from components.reward.model import last_token_scores
from lightning_rl.core.models import DTYPES, TINY_MODEL_PATH, load_pretrained, load_tokenizer
from lightning_rl.data.preference import PairDataModule, arithmetic_pairs
from lightning_rl.recipes import adamw_with_warmup

__all__ = [
    "BradleyTerryRewardModel",
    "PairDataModule",
    "arithmetic_pairs",
    "main",
    "pair_loss",
    "save_tiny_reward_model",
]


def pair_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Bradley-Terry negative log-likelihood, mean over pairs: -log sigmoid(r_c - r_r). Shapes: (N,), (N,) -> ()."""
    return -F.logsigmoid(chosen.float() - rejected.float()).mean()


def save_tiny_reward_model(
    path: str | Path, hidden_size: int = 32, layers: int = 2, heads: int = 2, seed: int = 0
) -> str:
    """A random tiny Llama sequence classifier (num_labels=1) + the built-in task's tokenizer: a test fixture."""
    from transformers import LlamaForSequenceClassification

    from lightning_rl.recipes.tiny import build_char_tokenizer, build_tiny_llama

    tokenizer = build_char_tokenizer()
    config = build_tiny_llama(tokenizer, hidden_size, layers, heads, seed).config
    config.num_labels = 1
    torch.manual_seed(seed + 1)
    model = LlamaForSequenceClassification(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


class BradleyTerryRewardModel(LightningModule):
    """A scalar reward r(x, y) trained on preference pairs with -log sigmoid(r_chosen - r_rejected)."""

    def __init__(
        self,
        path: str = TINY_MODEL_PATH,
        dtype: Literal["float32", "bfloat16", "float16"] = "float32",
        lr: float = 1e-5,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        output_dir: str | None = "runs/reward_model/final",
    ):
        """
        Args:
            path: initial weights: a causal LM (its backbone is kept and a scalar head is added, as in
                InstructGPT's RM from the SFT model) or an existing sequence classifier to keep training.
            dtype: parameter dtype at load time.
            lr: AdamW learning rate.
            weight_decay: AdamW weight decay.
            warmup_steps: linear LR warmup, in optimizer steps.
            output_dir: where ``save_pretrained`` writes the trained model and tokenizer at the end of
                ``fit`` (None = do not save).
        """
        super().__init__()
        self.save_hyperparameters()
        self.model = None
        self.tokenizer = None

    def configure_model(self) -> None:
        if self.model is not None:
            return
        from transformers import AutoModelForSequenceClassification

        self.tokenizer = load_tokenizer(self.hparams.path, "model.path")
        self.model = load_pretrained(
            AutoModelForSequenceClassification.from_pretrained,
            self.hparams.path,
            "model.path",
            num_labels=1,
            dtype=DTYPES[self.hparams.dtype],
        )
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.train()  # transformers loads in eval mode; Lightning switches to eval for validation and back

    def pair_scores(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(r_chosen, r_rejected), each (N,), from a batch of 2N right-padded sequences."""
        scores = last_token_scores(self.model, batch["input_ids"], batch["attention_mask"])  # (2N,)
        return scores.chunk(2)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        chosen, rejected = self.pair_scores(batch)
        loss = pair_loss(chosen, rejected)
        n = chosen.shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        self.log("train/accuracy", (chosen > rejected).float().mean(), batch_size=n)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        chosen, rejected = self.pair_scores(batch)
        n = chosen.shape[0]
        self.log("val/loss", pair_loss(chosen, rejected), batch_size=n, sync_dist=True)
        self.log("val/accuracy", (chosen > rejected).float().mean(), prog_bar=True, batch_size=n, sync_dist=True)
        self.log("val/margin", (chosen - rejected).mean(), batch_size=n, sync_dist=True)

    def configure_optimizers(self) -> dict[str, Any]:
        return adamw_with_warmup(
            self.model.parameters(), self.hparams.lr, self.hparams.weight_decay, self.hparams.warmup_steps
        )

    def on_fit_end(self) -> None:
        if self.hparams.output_dir and self.trainer.is_global_zero:
            self.save(self.hparams.output_dir)

    def save(self, directory: str) -> None:
        """``save_pretrained`` the model and tokenizer (loadable by `components.reward.RewardModel`)."""
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)


class RewardModelCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("model.path", "data.tokenizer")  # pairs are tokenised with the model's tokenizer


def main(
    args: list[str] | None = None, run: bool = True, prog: str = "python -m lightning_rl.recipes.reward_model"
) -> RewardModelCLI:
    """``lightning-rl reward-model [fit|validate] ...`` and ``python -m lightning_rl.recipes.reward_model fit|validate
    ...``; ``prog`` is the command its help names."""
    return RewardModelCLI(
        BradleyTerryRewardModel,
        PairDataModule,
        parser_kwargs={"parser_mode": "omegaconf+", "prog": prog},
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
    )


if __name__ == "__main__":
    main()
