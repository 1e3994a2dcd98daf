"""LoRA policies and critics: adapters train alone, the reference is the base with adapters off, checkpoints hold adapters."""

from __future__ import annotations

import pytest
import torch

from lightning_rl.core.logprobs import policy_logprobs
from lightning_rl.core.lora import LoraSpec, adapters_disabled, is_lora
from lightning_rl.core.models import ModelSpec, load_causal_lm
from lightning_rl.roster import reference_model
from tests.lightning_rl.cli_runs import cli_args, run_cli
from tests.support.probes import DENSE_REWARD, probe_batch

LORA = [
    "--model.policy.lora.rank=4",
    "--model.policy.lora.alpha=8",
    "--model.policy.lora.target_modules=[q_proj,v_proj,up_proj]",
]
WITH_KL = ["--model.kl.init_args.coef=0.1", "--model.optimizer.lr=1e-2"]


def count_loads(monkeypatch) -> list[str]:
    """Every causal LM the module builds, by config key (the roster's slots build them)."""
    import lightning_rl.roster as module

    built: list[str] = []

    def counting(spec, what="model.policy"):
        built.append(what)
        return load_causal_lm(spec, what)

    monkeypatch.setattr(module, "load_causal_lm", counting)
    return built


@pytest.fixture(scope="module")
def lora_grpo(tmp_path_factory, tiny_model_path):
    root = tmp_path_factory.mktemp("lora-grpo")
    mp = pytest.MonkeyPatch()
    built = count_loads(mp)
    try:
        cli = run_cli("fit", cli_args(root, tiny_model_path, 2, *DENSE_REWARD, *LORA, *WITH_KL, "--data.val_data=null"))
    finally:
        mp.undo()
    return cli.model, root, built


@pytest.mark.slow
def test_reference_is_the_base_model_with_adapters_off_and_no_second_model_is_built(lora_grpo, tiny_model_path):
    from transformers import AutoModelForCausalLM

    module, _, built = lora_grpo
    assert built == ["model.policy"] and module.reference is None and module.reference_is_base
    assert is_lora(module.policy)
    batch = probe_batch(module.tokenizer)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    with torch.no_grad(), reference_model(module) as reference:
        assert reference is module.policy  # the same object: no copy
        ref = policy_logprobs(reference, batch)[0]
        expected = policy_logprobs(base, batch)[0]
    with torch.no_grad():
        trained = policy_logprobs(module.policy, batch)[0]
    torch.testing.assert_close(ref, expected, rtol=0, atol=1e-6)
    assert (trained - expected).abs().max() > 1e-5  # the adapters moved the policy away from its base
    assert all(p.requires_grad == (".lora_" in n) for n, p in module.policy.named_parameters())  # switched back on


@pytest.mark.slow
def test_only_adapter_parameters_train_or_have_optimizer_state(lora_grpo, tiny_model_path):
    from transformers import AutoModelForCausalLM

    module, _, _ = lora_grpo
    base = dict(AutoModelForCausalLM.from_pretrained(tiny_model_path).named_parameters())
    adapters = {n: p for n, p in module.policy.named_parameters() if ".lora_" in n}
    assert len(adapters) == 2 * 3 * 2  # A and B x 3 targets x 2 layers
    for name, p in module.policy.named_parameters():
        if ".lora_" not in name:
            assert not p.requires_grad
            torch.testing.assert_close(p, base[name.replace(".base_layer.", ".")], rtol=0, atol=0)
    assert all(p.abs().max() > 0 for n, p in adapters.items() if "lora_B" in n)  # B starts at 0: it took steps
    optimizer = module.optimizers().optimizer
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in adapters.values()} and len(optimizer.state) == len(adapters)


def test_adapters_disabled_switches_back_even_on_error(tiny_model_path):
    model = load_causal_lm(ModelSpec(path=tiny_model_path, lora=LoraSpec(rank=2, target_modules=["q_proj"])))
    with pytest.raises(RuntimeError), adapters_disabled(model):
        assert not any(p.requires_grad for p in model.parameters())
        raise RuntimeError("boom")
    assert sum(p.requires_grad for p in model.parameters()) == 2 * 2


@pytest.mark.parametrize(
    "targets, message",
    [
        (["nope_proj"], "target_modules=\\['nope_proj'\\].*linear layers are named .*q_proj"),
        (["input_layernorm"], "cannot put adapters on LlamaForCausalLM"),
    ],
)
def test_bad_lora_targets_are_one_clear_error(tiny_model_path, targets, message):
    with pytest.raises(ValueError, match=message):
        load_causal_lm(ModelSpec(path=tiny_model_path, lora=LoraSpec(rank=2, target_modules=targets)))


@pytest.mark.slow
def test_merged_and_adapter_only_exports_reload_with_the_lora_models_logprobs(lora_grpo, tiny_model_path, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from lightning_rl.cli.export import main as export

    module, root, _ = lora_grpo
    checkpoint = root / "checkpoints" / "last.ckpt"
    stored = torch.load(checkpoint, weights_only=False)["state_dict"]
    assert {k for k in stored if k.startswith("policy.")} == {
        "policy." + n for n, p in module.policy.named_parameters() if p.requires_grad
    }
    batch = probe_batch(module.tokenizer)
    with torch.no_grad():
        expected = policy_logprobs(module.policy, batch)[0]
        merged = AutoModelForCausalLM.from_pretrained(
            export([str(checkpoint), str(tmp_path / "merged")])["policy"]
        ).eval()
        torch.testing.assert_close(policy_logprobs(merged, batch)[0], expected, rtol=0, atol=1e-5)
        folder = export([str(checkpoint), str(tmp_path / "adapter"), "--adapter_only"])["policy"]
        assert sorted(p.name for p in folder.iterdir() if p.name.startswith("adapter")) == [
            "adapter_config.json",
            "adapter_model.safetensors",
        ]
        adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_path), folder).eval()
        torch.testing.assert_close(policy_logprobs(adapted, batch)[0], expected, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_an_exported_adapter_loads_alone_with_auto_peft_from_any_folder(
    lora_grpo, tiny_model_path, tmp_path, monkeypatch
):
    """adapter_config.json names the task (peft needs it to pick the model class) and a base path that resolves from
    anywhere: a run started with a relative model.policy.path exported an adapter only that folder could load."""
    import json
    import os

    from peft import AutoPeftModelForCausalLM

    from lightning_rl.export import export_checkpoint

    module, root, _ = lora_grpo
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir(), elsewhere.mkdir()
    checkpoint = torch.load(root / "checkpoints" / "last.ckpt", weights_only=False)
    checkpoint["hf_export"]["policy"]["path"] = os.path.relpath(
        tiny_model_path, work
    )  # as recorded by a run started in work/
    torch.save(checkpoint, tmp_path / "relative.ckpt")
    monkeypatch.chdir(work)
    folder = export_checkpoint(tmp_path / "relative.ckpt", tmp_path / "hf", adapter_only=True)["policy"]
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["task_type"] == "CAUSAL_LM" and os.path.samefile(config["base_model_name_or_path"], tiny_model_path)
    monkeypatch.chdir(elsewhere)
    adapted = AutoPeftModelForCausalLM.from_pretrained(folder).eval()
    batch = probe_batch(module.tokenizer)
    with torch.no_grad():
        torch.testing.assert_close(
            policy_logprobs(adapted, batch)[0], policy_logprobs(module.policy, batch)[0], rtol=0, atol=1e-5
        )


@pytest.mark.slow
def test_adapter_checkpoint_on_a_different_base_is_one_clear_error(lora_grpo, tiny_model_path_b, tmp_path):
    _, root, _ = lora_grpo
    args = cli_args(
        tmp_path,
        tiny_model_path_b,
        3,
        *DENSE_REWARD,
        *LORA,
        *WITH_KL,
        "--data.val_data=null",
        f"--ckpt_path={root / 'checkpoints' / 'last.ckpt'}",
        "--new_run",  # the same run on another base is refused earlier, by the run's recorded policy path
    )
    with pytest.raises(
        ValueError, match="model.policy: the checkpoint holds LoRA adapters trained on a different base model than"
    ):
        run_cli("fit", args)
    with pytest.raises(ValueError, match="different base model"):
        _export_on(root, tiny_model_path_b, tmp_path)


@pytest.mark.parametrize(
    "change, message",
    [
        (["--model.policy.lora.rank=8"], r"model.policy.lora.rank: 4 in the checkpoint, 8 in this config"),
        (
            ["--model.policy.lora.target_modules=[q_proj,v_proj]"],
            r"model.policy.lora.target_modules: \['q_proj', 'v_proj', 'up_proj'\] in the checkpoint, \['q_proj', 'v_proj'\] in this config .*up_proj",
        ),
        (["--model.policy.lora.alpha=16"], r"model.policy.lora.alpha: 8.0 in the checkpoint, 16.0 in this config"),
        (
            ["--model.policy.lora=null"],
            r"model.policy.lora: the checkpoint holds LoRA adapters .*rank 4.*this config trains the policy in full",
        ),
    ],
)
@pytest.mark.slow
def test_resuming_adapters_with_another_lora_spec_names_the_key(lora_grpo, tiny_model_path, tmp_path, change, message):
    """Instead of torch's dozens of size mismatches (another rank), missing keys (other targets), or silently another
    scale (another alpha): one error naming the setting, with the checkpoint's value."""
    _, root, _ = lora_grpo
    args = cli_args(
        tmp_path,
        tiny_model_path,
        3,
        *DENSE_REWARD,
        *LORA,
        *WITH_KL,
        "--data.val_data=null",
        *change,
        f"--ckpt_path={root / 'checkpoints' / 'last.ckpt'}",
    )
    with pytest.raises(ValueError, match=message):
        run_cli("fit", args)


@pytest.mark.slow
def test_resuming_a_full_fine_tune_with_lora_names_the_key(tmp_path, tiny_model_path):
    full = tmp_path / "full"
    run_cli("fit", cli_args(full, tiny_model_path, 1, *DENSE_REWARD, "--data.val_data=null"))
    args = cli_args(
        tmp_path / "lora",
        tiny_model_path,
        2,
        *DENSE_REWARD,
        *LORA,
        "--data.val_data=null",
        f"--ckpt_path={full / 'checkpoints' / 'last.ckpt'}",
    )
    with pytest.raises(
        ValueError, match=r"model.policy.lora: the checkpoint's policy was trained in full .*model.policy.lora: null"
    ):
        run_cli("fit", args)


def _export_on(root, base: str, tmp_path):
    """Export after pointing the checkpoint's recorded base at another model (as if the path now held other weights)."""
    from lightning_rl.export import export_checkpoint

    checkpoint = torch.load(root / "checkpoints" / "last.ckpt", weights_only=False)
    checkpoint["hf_export"]["policy"]["path"] = base
    torch.save(checkpoint, tmp_path / "moved.ckpt")
    return export_checkpoint(tmp_path / "moved.ckpt", tmp_path / "hf")


@pytest.mark.slow
def test_lora_resume_is_exact_and_checkpoints_hold_adapters_only(tmp_path, tiny_model_path):
    from tests.support.resume import resume_matches_straight

    extra = [
        *DENSE_REWARD,
        *LORA,
        *WITH_KL,
        "--model.rollout.init_args.group_size=2",
        "--model.loop.ppo_epochs=2",
        "--model.loop.num_mini_batches=2",
    ]
    final, middle = resume_matches_straight(tmp_path, tiny_model_path, "configs/grpo.yaml", extra)
    policy = {k for k in final["state_dict"] if k.startswith("policy.")}
    assert policy and all(".lora_" in k for k in policy) and "policy." in final["lora_base"]
    assert not torch.equal(final["state_dict"][min(policy)], middle["state_dict"][min(policy)])
    assert final["optimizer_steps"]["policy"] == 16 and len(final["optimizer_states"][0]["state"]) == len(policy)


@pytest.mark.slow
def test_ppo_rlhf_with_lora_policy_and_critic_shares_one_frozen_base(tmp_path, tiny_model_path):
    from lightning_rl.export import export_checkpoint
    from lightning_rl.recipes.reward_model import save_tiny_reward_model

    reward_model = save_tiny_reward_model(tmp_path / "rm", seed=7)
    critic = [
        "--model.critic.init_args.init_from=policy",
        "--model.critic.init_args.lora.rank=4",
        "--model.critic.init_args.lora.target_modules=[q_proj,v_proj]",
    ]
    args = [
        *LORA,
        *critic,
        f"--model.reward.init_args.path={reward_model}",
        "--model.loop.ppo_epochs=1",
        "--data.val_data=null",
    ]
    cli = run_cli("fit", cli_args(tmp_path, tiny_model_path, 2, *args, config="configs/ppo_rlhf.yaml"))
    module = cli.model
    assert module.reference is None and module.reference_is_base
    policy_body, critic_body = module.policy.model, module.critic.backbone
    shared = [n for n, p in critic_body.named_parameters() if ".lora_" not in n]
    for name in shared:  # the critic's frozen base is the policy's own storage
        assert critic_body.get_parameter(name).data_ptr() == policy_body.get_parameter(name).data_ptr(), name
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n or n.startswith("critic.head.") for n in trainable)
    stored = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert set(stored["state_dict"]) >= {k for k in trainable} and not any(
        ".base_layer." in k for k in stored["state_dict"]
    )
    written = export_checkpoint(tmp_path / "checkpoints" / "last.ckpt", tmp_path / "hf")
    from transformers import AutoModelForTokenClassification

    exported = AutoModelForTokenClassification.from_pretrained(written["critic"]).eval()
    batch = probe_batch(module.tokenizer)
    from lightning_rl.core.inputs import sequence_inputs

    ids, mask, positions = sequence_inputs(batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
    with torch.no_grad():
        values = (
            exported(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -5:-1, 0]
            * batch.response_mask
        )
        torch.testing.assert_close(values, module.critic(batch), rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def one_process_lora(tmp_path_factory, tiny_model_path) -> dict:
    from tests.support.distributed import (
        SEEDED,
        no_checkpoints,
        one_process,
        probe_args,
    )

    return one_process(
        "configs/grpo.yaml",
        [
            *probe_args(tmp_path_factory.mktemp("lora-1"), tiny_model_path, 1, 4),
            *SEEDED,
            *LORA,
            *WITH_KL,
            *no_checkpoints(),
        ],
    )


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", pytest.param("fsdp", marks=pytest.mark.soak)])
def test_two_processes_equal_one_with_a_lora_policy_and_its_base_as_reference(
    tmp_path, tiny_model_path, one_process_lora, strategy
):
    """DDP, and FSDP2 (adapters and frozen base sharded alike; the reference is the sharded policy with adapters off)."""
    from tests.support.distributed import (
        SEEDED,
        assert_same_training,
        launch,
        no_checkpoints,
        probe_args,
    )

    extra = [*SEEDED, *LORA, *WITH_KL, *no_checkpoints(), "--config", f"configs/strategy/{strategy}.yaml"]
    two = launch("configs/grpo.yaml", [*probe_args(tmp_path, tiny_model_path, 2, 2), *extra])
    assert_same_training(one_process_lora, two)
    assert two["sharded"] == (["policy"] if strategy == "fsdp" else [])
    assert any(".lora_B" in k for k in two["state"]) and any(abs(loss) > 1e-4 for loss in two["losses"])
    assert not any(".base_layer." in k for k in two["state"])  # trainable state only: the adapters
