"""Export round trip: trained models written with save_pretrained reload with from_pretrained and give the same numbers."""

from __future__ import annotations

import sys

import pytest
import torch
from safetensors.torch import load_file

from lightning_rl.core.inputs import sequence_inputs
from lightning_rl.core.logprobs import policy_logprobs
from lightning_rl.export import export_checkpoint
from tests.support.checkpoints import (
    check_a_crafted_checkpoint_is_refused_without_running_its_code,
)
from tests.support.probes import DENSE_REWARD, probe_batch

from .cli_runs import cli_args, run_cli


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory, tiny_model_path):
    root = tmp_path_factory.mktemp("export-grpo")
    extra = [
        *DENSE_REWARD,
        "--data.val_data=null",
        "--trainer.callbacks+=lightning_rl.callbacks.HFExport",
        f"--trainer.callbacks.dirpath={root / 'at_fit_end'}",
    ]
    cli = run_cli("fit", cli_args(root, tiny_model_path, 2, *extra))
    return cli.model, root


@pytest.mark.slow
def test_exported_policy_reloads_with_the_same_logprobs(grpo_run, tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    module, root = grpo_run
    written = export_checkpoint(root / "checkpoints" / "last.ckpt", tmp_path / "hf")
    assert set(written) == {"policy"}  # GRPO has no critic
    exported = AutoModelForCausalLM.from_pretrained(written["policy"])
    tokenizer = AutoTokenizer.from_pretrained(written["policy"])
    batch = probe_batch(tokenizer)
    with torch.no_grad():
        expected, _ = policy_logprobs(module.policy, batch, temperature=1.0)
        got, _ = policy_logprobs(exported, batch, temperature=1.0)
        initial, _ = policy_logprobs(AutoModelForCausalLM.from_pretrained(tiny_model_path), batch, temperature=1.0)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert (expected - initial).abs().max() > 1e-4  # the export holds the trained weights, not the base model's
    assert tokenizer.get_vocab() == module.tokenizer.get_vocab()
    # the callback wrote the same weights at the end of fit
    at_end = load_file(root / "at_fit_end" / "policy" / "model.safetensors")
    from_checkpoint = load_file(written["policy"] / "model.safetensors")
    assert at_end.keys() == from_checkpoint.keys() and all(torch.equal(at_end[k], from_checkpoint[k]) for k in at_end)


@pytest.mark.slow
def test_export_command_and_dtype(grpo_run, tmp_path, monkeypatch, capsys):
    from lightning_rl.command import entry

    _, root = grpo_run
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "lightning-rl",
            "export",
            str(root / "checkpoints" / "last.ckpt"),
            str(tmp_path / "bf16"),
            "--dtype",
            "bfloat16",
        ],
    )
    entry()
    assert "policy: " in capsys.readouterr().out
    weights = load_file(tmp_path / "bf16" / "policy" / "model.safetensors")
    assert {v.dtype for v in weights.values()} == {torch.bfloat16}


@pytest.mark.slow
def test_exported_critic_reloads_as_a_token_classifier_with_the_same_values(tmp_path, tiny_model_path):
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    extra = [
        *DENSE_REWARD,
        "--data.val_data=null",
        "--model.rollout.init_args.group_size=2",
        "--model.critic.init_args.pretrain_steps=1",
    ]
    cli = run_cli("fit", cli_args(tmp_path / "run", tiny_model_path, 2, *extra, config="configs/vc_ppo.yaml"))
    written = export_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt", tmp_path / "hf")
    assert set(written) == {"policy", "critic"}
    critic = AutoModelForTokenClassification.from_pretrained(written["critic"])
    batch = probe_batch(AutoTokenizer.from_pretrained(written["critic"]))
    input_ids, attention_mask, position_ids = sequence_inputs(
        batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask
    )
    r = batch.response_ids.shape[1]
    with torch.no_grad():
        expected = cli.model.critic(batch)  # (B, R)
        logits = critic(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).logits  # (B, P + R, 1)
    got = logits[:, -(r + 1) : -1, 0] * batch.response_mask
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert expected.abs().max() > 1e-4  # the value head was trained away from its zero initialisation


def test_reward_model_checkpoint_exports_as_a_sequence_classifier(tmp_path, tiny_model_path):
    from transformers import AutoModelForSequenceClassification

    from lightning_rl.recipes.reward_model import BradleyTerryRewardModel

    module = BradleyTerryRewardModel(path=tiny_model_path, output_dir=None)
    module.configure_model()
    with torch.no_grad():
        for p in module.model.parameters():
            p.add_(0.01 * torch.randn_like(p))  # "trained": no longer the base model's weights
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}, tmp_path / "rm.ckpt")
    written = export_checkpoint(tmp_path / "rm.ckpt", tmp_path / "hf")
    exported = AutoModelForSequenceClassification.from_pretrained(written["reward_model"])
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    with torch.no_grad():
        torch.testing.assert_close(
            exported(input_ids=ids).logits, module.model.eval()(input_ids=ids).logits, rtol=0, atol=1e-6
        )


def test_unknown_checkpoint_is_a_clear_error(tmp_path):
    torch.save({"state_dict": {"w": torch.zeros(1)}}, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="not a checkpoint of RLModule"):
        export_checkpoint(tmp_path / "other.ckpt", tmp_path / "hf")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        export_checkpoint(tmp_path / "missing.ckpt", tmp_path / "hf")


def test_a_crafted_checkpoint_is_refused_without_running_its_code(tmp_path):
    check_a_crafted_checkpoint_is_refused_without_running_its_code(tmp_path)
