"""LoRA adapters on the policy and the critic (Hu et al. 2021, arXiv:2106.09685), built with ``peft``.

    W x  ->  W x + (alpha / rank) B A x,    A: (rank, in), B: (out, rank), B = 0 at the start

The frozen base weights ``W`` stay in the model, in place (peft wraps each targeted ``nn.Linear`` as
``<name>.base_layer`` next to ``<name>.lora_A`` / ``lora_B``); only ``A`` and ``B`` train, so only they
have gradients and optimizer state. What this buys the RL loop:

* reference = the same model with its adapters switched off (``adapters_disabled``): with a LoRA
  policy and no explicit ``reference``, no second model is loaded;
* a LoRA critic initialised from the policy reuses the policy's frozen base tensors (same storage),
  exact because neither changes; it is a separate copy when the critic's dtype differs from the
  policy's, when it starts from a reward model or a path, or when the policy trains in full;
* checkpoints hold the adapters, the value head and the optimizer state; the base is reloaded from
  its path and checked against a fingerprint stored with the checkpoint.

A mixture of experts takes adapters on its attention and other ``nn.Linear`` layers only: its experts (3-D tensors,
one slice per expert) and its routers get none (``all-linear`` leaves them out; a target that names only them is
refused in one line).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

ADAPTER = "default"  # peft's adapter name; one adapter per model
_PEFT_PREFIX = "base_model.model."  # where PeftModel keeps the wrapped model: its adapter files name weights from there


@dataclass
class LoraSpec:
    """Low-rank adapters for a model (``peft.LoraConfig``)."""

    rank: int = 16
    """r, the inner dimension of B A."""
    alpha: float = 32.0
    """The update is scaled by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapter's input; above 0 the same policy gives two different log-probs (ratio != 1 before an update)."""
    target_modules: list[str] | str = "all-linear"
    """Module names (suffixes, e.g. ``[q_proj, v_proj]``), a regex, or ``all-linear`` (every linear layer but the output head)."""
    init_seed: int = 0
    """Seed of A's random initialisation, drawn apart from the global random state: every rank and every run starts from the same adapters."""


def apply_lora(model: nn.Module, spec: LoraSpec, what: str, exclude: list[str] | None = None) -> nn.Module:
    """Inject adapters into ``model`` in place and freeze everything else; returns ``model`` (not a peft wrapper),
    so its forward keeps the transformers signature. ``what`` names the config key in errors. ``exclude``: module
    prefixes that get no adapter (a vision tower, whose layer names, e.g. ``up_proj``, may match the targets too)."""
    import re

    from peft import LoraConfig, get_peft_model

    if spec.rank < 1:
        raise ValueError(f"{what}.lora.rank must be >= 1, got {spec.rank}")
    routed = _moe_targets(model, spec.target_modules)
    if routed:
        raise ValueError(
            f"{what}.lora.target_modules={spec.target_modules!r} names {routed[:4]}, experts or routers of the mixture "
            f"of experts {type(model).__name__}: LoRA goes on its attention and other linear layers only "
            f"({_linear_names(model)}); drop them"
        )
    from lightning_rl.core.moe import routers

    targets = spec.target_modules
    if routers(model) and targets == "all-linear":  # peft's all-linear would wrap the experts and routers too
        head = model.get_output_embeddings()
        targets = sorted(
            {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear) and m is not head}
        )
    exclude = [*(exclude or []), *(router.name for router in routers(model))]  # a router may be an nn.Linear
    excluded = "|".join(re.escape(prefix) for prefix in exclude)
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=targets,
        bias="none",
        exclude_modules=f"({excluded})(\\..*)?" if excluded else None,
    )
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.init_seed)
            get_peft_model(model, config, adapter_name=ADAPTER)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"{what}.lora: peft cannot put adapters on {type(model).__name__} with target_modules={spec.target_modules!r} "
            f"({str(err).splitlines()[0]}). Its linear layers are named {_linear_names(model)}: set {what}.lora.target_modules to some of them"
        ) from err
    model.lora_base_fingerprint = base_fingerprint(model)
    return model


def _linear_names(model: nn.Module) -> list[str]:
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)})


def _moe_targets(model: nn.Module, targets: list[str] | str) -> list[str]:
    """The targets (as peft matches them: a name's suffix, or a regex over whole names) that name only a mixture of
    experts' routers, expert modules (those holding 3-D tensors) or expert tensors, never an ``nn.Linear``."""
    import re

    from lightning_rl.core.moe import routers

    found = routers(model)
    if not found or targets == "all-linear":
        return []
    modules = dict(model.named_modules())
    linear = [name for name, m in modules.items() if isinstance(m, nn.Linear)]
    experts = [name for name, m in modules.items() if any(p.dim() == 3 for p in m.parameters(recurse=False))]
    routed = [r.name for r in found] + experts
    routed += [f"{name}.{p}" for name in experts for p, _ in modules[name].named_parameters(recurse=False)]

    def matches(target: str, names: list[str]) -> bool:
        if isinstance(targets, str):
            return any(re.fullmatch(target, name) for name in names)
        return any(name == target or name.endswith("." + target) for name in names)

    asked = [targets] if isinstance(targets, str) else list(targets)
    return [t for t in asked if matches(t, routed) and not matches(t, linear)]


def is_lora(model: nn.Module | None) -> bool:
    return model is not None and bool(getattr(model, "peft_config", None))


def _tuner_layers(model: nn.Module) -> list[nn.Module]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` computing with its base weights only (peft's per-layer switch; what ``PeftModel.disable_adapter`` does)."""
    layers = _tuner_layers(model)
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)  # also makes the adapter weights trainable again


def reference_is_base(policy_spec, reference_spec, needs) -> bool:
    """A LoRA policy without an explicit reference takes its reference log-probs from its own base weights."""
    return policy_spec.lora is not None and reference_spec is None and "ref_logprobs" in needs


@torch.no_grad()
def base_fingerprint(model: nn.Module) -> list[float]:
    """Sum and sum of squares (float64) over the frozen weights: tells an adapter checkpoint which base it was trained on."""
    total = torch.zeros(2, dtype=torch.float64)
    for _, p in sorted((n, p) for n, p in model.named_parameters() if not p.requires_grad):
        x = p.detach().double()
        total += torch.stack([x.sum(), x.square().sum()]).cpu()
    return total.tolist()


def check_base(stored: list[float] | None, model: nn.Module, what: str, path: str) -> None:
    """Raise when ``model``'s frozen base is not the one an adapter checkpoint was trained on."""
    current = getattr(model, "lora_base_fingerprint", None)
    if stored is None or current is None:
        return
    if not torch.allclose(
        torch.tensor(stored, dtype=torch.float64), torch.tensor(current, dtype=torch.float64), rtol=1e-9, atol=0
    ):
        raise ValueError(
            f"{what}: the checkpoint holds LoRA adapters trained on a different base model than '{path}' "
            f"(weight fingerprint {stored} != {current}); set {what}.path (and dtype) to the base the run started from"
        )


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter weights, named from ``model`` without the adapter name (``...q_proj.lora_A.weight``)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model, adapter_name=ADAPTER)


def save_adapter(
    model: nn.Module,
    directory,
    state: dict[str, torch.Tensor] | None = None,
    base_path: str | None = None,
    task_type: str | None = None,
) -> None:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` (loads with ``PeftModel.from_pretrained``; with
    ``task_type`` and a resolvable ``base_path`` also alone, e.g. ``AutoPeftModelForCausalLM.from_pretrained``)."""
    import copy
    from pathlib import Path

    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = copy.copy(model.peft_config[ADAPTER])  # the live model's config stays as it is
    if base_path is not None:
        config.base_model_name_or_path = base_path
    if task_type is not None:
        config.task_type = task_type
    config.save_pretrained(directory)
    save_file(adapter_file_tensors(model, state), directory / "adapter_model.safetensors")


def adapter_file_tensors(model: nn.Module, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The adapter as ``adapter_model.safetensors`` holds it: CPU tensors named from the peft wrapper (``base_model.model.``)."""
    state = adapter_state(model) if state is None else state
    return {_PEFT_PREFIX + k: v.detach().cpu().contiguous() for k, v in state.items()}


def adapter_config(model: nn.Module) -> dict:
    """The adapter's ``adapter_config.json`` as a dict (sets as lists, as peft writes them)."""
    import json

    return json.loads(json.dumps(model.peft_config[ADAPTER].to_dict(), default=sorted))


def lora_layers(model: nn.Module) -> dict[str, tuple[float, bool]]:
    """{layer name: (scaling alpha / rank, fan_in_fan_out)} of the layers carrying the adapter."""
    from peft.tuners.lora import LoraLayer

    return {
        name: (layer.scaling[ADAPTER], layer.fan_in_fan_out)
        for name, layer in model.named_modules()
        if isinstance(layer, LoraLayer) and ADAPTER in layer.lora_A
    }


def merged_weight(
    weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float, fan_in_fan_out: bool
) -> torch.Tensor:
    """``W + scaling B A`` in ``W``'s dtype. Shapes: weight (out, in) (transposed when ``fan_in_fan_out``), a (r, in), b (out, r)."""
    delta = (b.float() @ a.float()) * scaling  # (out, in)
    return (weight.float() + (delta.T if fan_in_fan_out else delta)).to(weight.dtype)


def merged_state_dict(model: nn.Module, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The plain transformers state dict of a LoRA ``model``: ``W + (alpha / rank) B A`` for every adapted layer.

    ``state``: ``model``'s state dict already gathered (unsharded) by the caller; default ``model.state_dict()``.
    The model itself is left untouched (its adapters keep training).
    """
    state = model.state_dict() if state is None else state
    merged = {k.replace(".base_layer.", "."): v for k, v in state.items() if ".lora_" not in k}
    with torch.no_grad():
        for name, (scaling, fan_in_fan_out) in lora_layers(model).items():
            a, b = state[f"{name}.lora_A.{ADAPTER}.weight"], state[f"{name}.lora_B.{ADAPTER}.weight"]
            merged[f"{name}.weight"] = merged_weight(merged[f"{name}.weight"], a, b, scaling, fan_in_fan_out)
    return merged
