"""The Bradley-Terry reward-model trainer: pairs, loss, held-out accuracy, the saved model, its CLI."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from components.reward import RewardModel
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.data.tasks import arithmetic_rows
from lightning_rl.recipes.reward_model import BradleyTerryRewardModel, PairDataModule, arithmetic_pairs, main, pair_loss


def _write_pairs(path, n: int, seed: int, columns=("prompt", "chosen", "rejected")) -> str:
    """An easy preference: the response "1" beats "0" whatever the prompt."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            prompt = f"{rng.randint(0, 99)}+{rng.randint(0, 99)}="
            f.write(json.dumps(dict(zip(columns, (prompt, "1", "0")))) + "\n")
    return str(path)


def test_arithmetic_pairs_are_correct_against_wrong_and_keep_the_split():
    train, test = arithmetic_pairs("train", seed=0), arithmetic_pairs("test", seed=0)
    rows = {r["prompt"]: r["answer"] for r in arithmetic_rows("train")}
    assert len(train) == len(rows) and len(test) == 500
    assert all(p["chosen"] == rows[p["prompt"]] and p["rejected"] != p["chosen"] for p in train)
    assert {p["prompt"] for p in train}.isdisjoint({p["prompt"] for p in test})
    assert all(p["rejected"].lstrip("-").isdigit() for p in train)
    assert arithmetic_pairs("test", seed=0) == test and arithmetic_pairs("test", seed=1) != test
    # mistakes are mostly near misses, like a weak policy's
    near = sum(abs(int(p["rejected"]) - int(p["chosen"])) <= 10 for p in train) / len(train)
    assert 0.3 < near < 0.9


def test_pairs_from_jsonl_with_a_column_mapping(tmp_path, tiny_model_path):
    data = _write_pairs(tmp_path / "p.jsonl", 6, 0, columns=("question", "good", "bad"))
    dm = PairDataModule(
        train_data=data,
        val_data=None,
        columns={"prompt": "question", "chosen": "good", "rejected": "bad"},
        tokenizer=tiny_model_path,
        batch_size=3,
    )
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    tok = dm._tokenizer()
    assert batch["input_ids"].shape[0] == 6  # 3 chosen, then 3 rejected
    lengths = batch["attention_mask"].sum(-1)
    for i in range(6):
        n = int(lengths[i])
        ids = batch["input_ids"][i]
        assert int(ids[n - 1]) == tok.eos_token_id and bool((ids[n:] == tok.pad_token_id).all())
        assert tok.decode(ids[n - 2 : n - 1]) == ("1" if i < 3 else "0")
    from lightning_rl.data.checks import DataError

    with pytest.raises(
        DataError,
        match=r"has no column 'prompt' \(data.columns.prompt\), 'chosen' \(data.columns.chosen\), 'rejected' "
        r"\(data.columns.rejected\); its columns are \['question', 'good', 'bad'\]: map them with data.columns: "
        r"\{prompt: <column>, chosen: <column>, rejected: <column>\}",
    ):
        PairDataModule(train_data=data, val_data=None, tokenizer=tiny_model_path).setup("fit")


def test_overlong_pairs_are_dropped_with_a_warning(tmp_path, tiny_model_path):
    data = _write_pairs(tmp_path / "p.jsonl", 4, 0)
    dm = PairDataModule(train_data=data, val_data=None, tokenizer=tiny_model_path, max_length=3)
    with pytest.raises(ValueError, match="no preference pairs left"):
        with pytest.warns(UserWarning, match="max_length=3"):
            dm.setup("fit")


def test_loss_and_accuracy_hand_computed(tiny_model_path):
    module = BradleyTerryRewardModel(path=tiny_model_path)
    module.configure_model()
    dm = PairDataModule(tokenizer=tiny_model_path, val_data=None)
    batch = dm._collate(
        [{"chosen": [5, 6, 7, 1], "rejected": [5, 6, 8, 1]}, {"chosen": [9, 1], "rejected": [9, 9, 9, 1]}]
    )
    # log(1 + e^-2) = 0.126928, log(1 + e^1) = 1.313262
    assert float(pair_loss(torch.tensor([2.0, 0.0]), torch.tensor([0.0, 1.0]))) == pytest.approx(
        (0.126928 + 1.313262) / 2, abs=1e-6
    )
    with torch.no_grad():
        module.model.score.weight.zero_()  # every score 0: loss log 2
        assert float(pair_loss(*module.pair_scores(batch))) == pytest.approx(math.log(2), abs=1e-6)
        module.model.score.weight.normal_()
        chosen, rejected = module.pair_scores(batch)
        # each score is the classifier's own reading of the unpadded sequence
        alone = module.model(input_ids=torch.tensor([[9, 9, 9, 1]])).logits[0, 0]
        torch.testing.assert_close(rejected[1], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_fit_through_the_cli_saves_a_reward_model_rl_can_load(tmp_path, tiny_model_path):
    train = _write_pairs(tmp_path / "train.jsonl", 256, 0)
    val = _write_pairs(tmp_path / "val.jsonl", 64, 1)
    out = tmp_path / "rm"
    cli = main(
        [
            "fit", "--config", "configs/reward_model.yaml",
            f"--model.path={tiny_model_path}", f"--model.output_dir={out}", "--model.lr=3e-3", "--model.warmup_steps=0",
            f"--data.train_data={train}", f"--data.val_data={val}", "--data.batch_size=32",
            "--trainer.max_steps=24", "--trainer.val_check_interval=8", "--trainer.logger=false",
            f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        ]
    )  # fmt: skip
    metrics = cli.trainer.callback_metrics
    assert float(metrics["val/accuracy"]) == 1.0 and float(metrics["val/margin"]) > 0
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    # RL reads the saved model at the same position as training did
    reward = RewardModel(path=str(out))
    reward.setup(cli.datamodule._tokenizer())
    tok = cli.datamodule._tokenizer()
    prompt = torch.tensor([[tok.pad_token_id] + tok("12+30=", add_special_tokens=False)["input_ids"]])
    responses = torch.tensor(
        [
            [tok.convert_tokens_to_ids("1"), tok.eos_token_id, tok.pad_token_id],
            [tok.convert_tokens_to_ids("0"), tok.eos_token_id, tok.pad_token_id],
        ]
    )
    batch = RolloutBatch(
        prompt_ids=prompt.repeat(2, 1), prompt_mask=(prompt != tok.pad_token_id).long().repeat(2, 1),
        response_ids=responses, response_mask=torch.tensor([[1, 1, 0], [1, 1, 0]]),
    )  # fmt: skip
    scores = reward(batch)
    assert float(scores[0]) > float(scores[1])
    pairs = cli.datamodule._collate(
        [
            {
                "chosen": prompt[0, 1:].tolist() + responses[0, :2].tolist(),
                "rejected": prompt[0, 1:].tolist() + responses[1, :2].tolist(),
            }
        ]
    )
    with torch.no_grad():
        trained = torch.cat(cli.model.pair_scores(pairs))
    torch.testing.assert_close(scores, trained, atol=1e-5, rtol=1e-5)
