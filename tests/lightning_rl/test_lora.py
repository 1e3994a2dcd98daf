"""LoRA policies and critics: adapters train alone, the reference is the base with adapters off, checkpoints hold adapters."""

from __future__ import annotations

import pytest
import torch

from lightning_rl.lora import LoraSpec, adapters_disabled, is_lora, reference_model
from lightning_rl.logprobs import policy_logprobs
from lightning_rl.models import ModelSpec, load_causal_lm

from .cli_runs import cli_args, run_cli
from .test_export import DENSE_REWARD, probe_batch

LORA = ["--model.policy.lora.rank=4", "--model.policy.lora.alpha=8", "--model.policy.lora.target_modules=[q_proj,v_proj,up_proj]"]
WITH_KL = ["--model.kl.init_args.coef=0.1", "--model.optimizer.lr=1e-2"]


def count_loads(monkeypatch) -> list[str]:
    """Every causal LM the module builds, by config key."""
    import lightning_rl.module as module

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
    [(["nope_proj"], "target_modules=\\['nope_proj'\\].*linear layers are named .*q_proj"), (["input_layernorm"], "cannot put adapters on LlamaForCausalLM")],
)
def test_bad_lora_targets_are_one_clear_error(tiny_model_path, targets, message):
    with pytest.raises(ValueError, match=message):
        load_causal_lm(ModelSpec(path=tiny_model_path, lora=LoraSpec(rank=2, target_modules=targets)))
