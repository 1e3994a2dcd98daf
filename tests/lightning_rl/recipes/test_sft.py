"""Supervised fine-tuning (lightning_rl.recipes.sft): the loss on completion tokens only, its data errors, and a run of
configs/sft.yaml that learns the built-in task and exports a policy that loads with `from_pretrained`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lightning_rl.cli.commands import command_line
from lightning_rl.core.batch import Prompts
from lightning_rl.core.models import TINY_MODEL_PATH, ModelSpec
from lightning_rl.data.checks import DataError
from lightning_rl.recipes.sft import SupervisedFineTuning, main

REPO = Path(__file__).parents[3]


def _module(path: str) -> SupervisedFineTuning:
    module = SupervisedFineTuning(policy=ModelSpec(path=path))
    module.configure_model()
    return module


def _prompts(tok, texts: list[str], completions: list[str]) -> Prompts:
    rows = [tok(t)["input_ids"] for t in texts]
    width = max(map(len, rows))
    ids = torch.tensor(
        [[tok.pad_token_id] * (width - len(r)) + r for r in rows]
    )  # left-padded, as the data module gives them
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return Prompts(ids, mask, {"prompt": texts, "completion": completions})


def test_the_loss_is_the_completion_tokens_mean_negative_log_likelihood(tiny_model_path):
    """Against transformers' own loss with the prompt's labels masked (-100), one unpadded row at a time: the
    prompt's tokens are never targets, EOS is, and left padding changes nothing."""
    module = _module(tiny_model_path)
    tok = module.tokenizer
    texts, completions = ["7+8=", "12+30="], ["15", "42"]
    totals, tokens = 0.0, 0
    for text, completion in zip(texts, completions):
        prompt = tok(text)["input_ids"]
        target = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ids = torch.tensor([prompt + target])
        labels = torch.tensor([[-100] * len(prompt) + target])
        with torch.no_grad():
            totals += float(module.policy(input_ids=ids, labels=labels).loss) * len(target)
        tokens += len(target)
    with torch.no_grad():
        loss, counted = module.loss(_prompts(tok, texts, completions))
    assert counted == tokens == 6
    assert float(loss) == pytest.approx(totals / tokens, abs=1e-5)


def test_a_missing_completion_column_names_the_key_and_the_mapping(tiny_model_path):
    module = _module(tiny_model_path)
    prompts = _prompts(module.tokenizer, ["1+1="], ["2"])
    prompts.columns.pop("completion")
    with pytest.raises(DataError, match=r"no 'completion' column.*model.completion_key.*\['prompt'\].*data.columns"):
        module.loss(prompts)


def test_a_data_mistake_on_the_command_line_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(
        "sys.argv",
        [
            "sft",
            "fit",
            "--config",
            "configs/sft.yaml",
            "--data.columns={prompt: prompt}",
            "--data.val_size=4",
            "--trainer.max_steps=1",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.logger=false",
            "--trainer.enable_checkpointing=false",
            "--trainer.callbacks=null",
            "--trainer.enable_progress_bar=false",
        ],
    )
    monkeypatch.setattr("sys.path", list(sys.path))  # command_line() moves the working folder to its end
    with pytest.raises(SystemExit) as done:
        command_line(main)
    assert done.value.code == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: no 'completion' column in the data (model.completion_key); its columns: ['answer', 'prompt']. "
        "Map yours with data.columns, e.g. '{prompt: question, completion: solution}'"
    ]


@pytest.mark.slow
def test_the_sft_recipe_learns_the_builtin_task_and_exports_a_policy(tmp_path, monkeypatch):
    """configs/sft.yaml, 20 steps on the shipped tiny policy (which learnt from a careless teacher): the held-out greedy
    accuracy climbs from its start to most answers right, the loss falls, the run has its version folder, and the
    export is a causal LM that gives the same greedy answers."""
    from lightning_rl.export import export_checkpoint
    from tests.lightning_rl.cli_runs import scalars

    monkeypatch.chdir(tmp_path)
    cli = main(
        [
            "fit",
            "--config",
            str(REPO / "configs" / "sft.yaml"),
            f"--model.policy.path={REPO / TINY_MODEL_PATH}",
            "--trainer.max_steps=20",
            "--trainer.val_check_interval=10",
            "--data.val_size=100",
            "--trainer.enable_progress_bar=false",
        ]
    )
    runs = tmp_path / "runs"
    points = scalars(runs, "sft")
    accuracy = [value for _, value in points["val/accuracy"]]
    loss = [value for _, value in points["train/loss"]]
    assert len(accuracy) == 3 and accuracy[0] < 0.4 and accuracy[-1] >= 0.8, accuracy
    assert sum(loss[-5:]) / 5 < 0.6 * sum(loss[:5]) / 5, loss
    checkpoint = runs / "sft" / "latest" / "checkpoints" / "last.ckpt"
    assert (
        torch.load(checkpoint, weights_only=False)["global_step"] == 20
        and (runs / "sft" / "version_0" / "config.yaml").exists()
    )

    written = export_checkpoint(checkpoint, tmp_path / "hf")
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(written["policy"])
    tok = cli.model.tokenizer
    prompts = _prompts(tok, ["37+45=", "8+9="], ["82", "17"])
    generate = dict(
        input_ids=prompts.prompt_ids,
        attention_mask=prompts.prompt_mask,
        max_new_tokens=4,
        do_sample=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    cli.model.eval()
    with torch.no_grad():
        assert torch.equal(exported.generate(**generate), cli.model.policy.generate(**generate))
