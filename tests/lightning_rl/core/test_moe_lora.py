"""LoRA on a mixture of experts (lightning_rl/core/lora.py): adapters on the attention (and other ``nn.Linear``)
layers only; a target that names only experts or routers is refused in one line."""

from __future__ import annotations

import pytest
from torch import nn

from lightning_rl.core.lora import LoraSpec, apply_lora
from tests.support.moe import FAMILIES, build_moe


@pytest.mark.parametrize("family", FAMILIES)
def test_all_linear_adapts_the_attention_and_leaves_experts_and_routers_frozen(family):
    from lightning_rl.core.moe import routers

    model, _ = build_moe(family)
    apply_lora(model, LoraSpec(rank=4), "model.policy")
    adapted = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if hasattr(m, "lora_A")}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj"}
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    assert len(trainable) == 2 * 4 * 2  # layers x (q, k, v, o) x (A, B)
    assert routers(model) and not any(hasattr(r.module, "lora_A") for r in routers(model))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("targets", [["q_proj", "experts"], ["gate"], ["v_proj", "down_proj"], r".*\.experts"])
def test_a_target_naming_experts_or_routers_is_refused_in_one_line(family, targets):
    model, _ = build_moe(family)
    with pytest.raises(ValueError) as caught:
        apply_lora(model, LoraSpec(rank=4, target_modules=targets), "model.policy")
    message = str(caught.value)
    named = [t for t in ([targets] if isinstance(targets, str) else targets) if t not in ("q_proj", "v_proj")]
    assert message.startswith(f"model.policy.lora.target_modules={targets!r} names {named!r}, experts or routers")
    assert "attention and other linear layers only (['k_proj', 'lm_head', 'o_proj', 'q_proj', 'v_proj'])" in message
    assert "\n" not in message
    assert not any(isinstance(m, nn.Module) and hasattr(m, "lora_A") for m in model.modules())  # nothing applied
