"""Write trained models in Hugging Face format (``save_pretrained``), from a checkpoint or from a live module.

    export_checkpoint("runs/grpo/latest/checkpoints/last.ckpt", "runs/grpo/hf")       # in Python
    lightning-rl export runs/grpo/latest/checkpoints/last.ckpt runs/grpo/hf --dtype bfloat16

Output folders (each loads with ``from_pretrained``):

* ``policy/``: ``AutoModelForCausalLM`` + tokenizer (a vision-language policy: ``AutoModelForImageTextToText``, its
  tokenizer with the chat template, and its image processor).
* ``critic/`` (presets with a ``ValueCritic``): ``AutoModelForTokenClassification`` with one label; its
  logit at position ``t`` is V(s) read from that position's hidden state (the critic's backbone
  becomes the base model, its value head the ``score`` layer, in the backbone's dtype).
* LoRA runs: the checkpoint holds the adapters only; the base is reloaded from its recorded path
  (checked against the weight fingerprint stored with the adapters) and the adapters are merged into
  it, so ``policy/`` and ``critic/`` are full models as above. ``--adapter_only`` writes the adapters
  instead: ``policy/`` loads alone with ``AutoPeftModelForCausalLM.from_pretrained("policy")`` (its config names the
  base by its absolute path, or its hub id), or as ``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), "policy")``;
  ``critic/`` holds the backbone's adapter and ``value_head.safetensors``.
* ``reward_model/`` (checkpoints of the reward-model trainer, ``lightning_rl.recipes.reward_model``):
  ``AutoModelForSequenceClassification`` + tokenizer.

Checkpoints: a Lightning ``.ckpt`` file (single device, DDP), a folder of shards written by
``FSDP2Strategy``, or a DeepSpeed folder (consolidated with Lightning's ZeRO converter first).
The architecture is rebuilt from the config stored in the checkpoint; the tokenizer is read from
the policy's original path (``--tokenizer`` overrides it). Checkpoints are read with
``torch.load(weights_only=True)`` (`lightning_rl.checkpoint`): tensors, plain containers and a few path types, never
arbitrary pickled code, so a crafted ``.ckpt`` cannot run anything.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from lightning_rl.checkpoint import load_checkpoint
from lightning_rl.core.lora import LoraSpec, merged_state_dict
from lightning_rl.roster import ROSTER, Slot


def _config(values: dict[str, Any]):
    from transformers import AutoConfig

    values = dict(values)
    return AutoConfig.for_model(values.pop("model_type"), **values)


def _strip(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def _cast(state: dict[str, Tensor], dtype: torch.dtype | None) -> dict[str, Tensor]:
    return {
        k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).contiguous() for k, v in state.items()
    }


def _build(auto_class, config, state: dict[str, Tensor], what: str):
    """``auto_class`` from ``config`` with ``state`` as its weights (built on the meta device: no random init)."""
    with torch.device("meta"):
        model = auto_class.from_config(config)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    tied = set(model._tied_weights_keys or [])  # a transformers class attribute, None where nothing is tied
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ValueError(
            f"{what}: checkpoint weights do not match {type(model).__name__}: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    model.tie_weights()
    # non-persistent buffers (e.g. rotary frequencies) are rebuilt by from_pretrained; keep them off the meta device
    for name, buffer in list(model.named_buffers()):
        if buffer.is_meta:
            owner, _, leaf = name.rpartition(".")
            model.get_submodule(owner).register_buffer(
                leaf, torch.zeros(buffer.shape, dtype=buffer.dtype), persistent=False
            )
    return model.eval()


@dataclass(frozen=True)
class ExportKind:
    """How `lightning-rl export` writes one kind of model (a slot's ``export_as``). Each function takes the slot's
    ``hf_export`` entry, the whole ``hf_export`` and the slot's state (its prefix stripped)."""

    write: Callable[..., None]
    """(state, entry, info, folder, dtype, tokenizer, processor path) -> writes a from_pretrained folder."""
    lora_model: Callable[[dict, dict, dict[str, Tensor]], torch.nn.Module]
    """The LoRA model rebuilt on its reloaded (and checked) base, with the trained adapters loaded."""
    write_adapter: Callable[..., None]
    """(model, entry, folder, tokenizer) -> writes the adapters alone."""


def _exported(info: dict[str, Any]) -> list[Slot]:
    """The roster's exported slots this checkpoint holds, in roster order."""
    return [slot for slot in ROSTER if slot.export_as is not None and slot.name in info]


def export_state(
    state: dict[str, Tensor],
    info: dict[str, Any],
    out_dir: str | Path,
    dtype: torch.dtype | None = None,
    tokenizer: str | None = None,
) -> dict[str, Path]:
    """Write each exported model of an ``RLModule`` state dict (``policy.*``, ``critic.*`` keys) to ``out_dir/<slot>``."""
    from lightning_rl.core.models import load_tokenizer

    out_dir = Path(out_dir)
    state = merge_adapters(state, info)
    processor = tokenizer or info["policy"]["tokenizer"]
    tok = load_tokenizer(processor, "--tokenizer (the policy's tokenizer)")
    written: dict[str, Path] = {}
    for slot in _exported(info):
        written[slot.name] = out_dir / slot.name
        trained = _strip(state, slot.name + ".")
        KINDS[slot.export_as].write(trained, info[slot.name], info, written[slot.name], dtype, tok, processor)
    return written


def _write_causal_lm(state, entry, info, folder: Path, dtype, tok, processor: str) -> None:
    from lightning_rl.core.models import is_vision_language, load_pretrained, policy_class

    config = _config(entry["config"])
    _build(policy_class(config), config, _cast(state, dtype), "policy").save_pretrained(folder)
    tok.save_pretrained(folder)
    if is_vision_language(config):
        from transformers import AutoImageProcessor

        load_pretrained(
            AutoImageProcessor.from_pretrained, processor, "--tokenizer (the policy's processor)"
        ).save_pretrained(folder)


def _write_value_model(state, entry, info, folder: Path, dtype, tok, processor: str) -> None:
    from transformers import AutoModelForTokenClassification

    config = _config(entry["config"])
    config.num_labels = 1
    config.classifier_dropout = 0.0  # the critic trains without dropout
    prefix = AutoModelForTokenClassification._model_mapping[type(config)].base_model_prefix
    backbone = {f"{prefix}.{k}": v for k, v in _strip(state, "backbone.").items()}
    backbone_dtype = next(iter(backbone.values())).dtype
    head = {f"score.{k}": v.to(backbone_dtype) for k, v in _strip(state, "head.").items()}
    critic = _build(AutoModelForTokenClassification, config, _cast({**backbone, **head}, dtype), "critic")
    critic.save_pretrained(folder)
    tok.save_pretrained(folder)


def _lora_policy(policy_info: dict[str, Any], info: dict[str, Any], adapters: dict[str, Tensor]):
    """The policy's base, reloaded from its recorded path and checked, with the trained adapters loaded into it."""
    from lightning_rl.core.lora import check_base
    from lightning_rl.core.models import ModelSpec, load_causal_lm

    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    spec = ModelSpec(
        **{**{k: v for k, v in policy_info.items() if k in fields}, "lora": LoraSpec(**policy_info["lora"])}
    )
    model = load_causal_lm(spec, "policy (the adapters' base, recorded in the checkpoint)")
    check_base(policy_info.get("base_fingerprint"), model, "the checkpoint's policy", spec.path)
    _load_adapters(model, adapters, "policy")
    return model


def _lora_critic(critic_info: dict[str, Any], info: dict[str, Any], trained: dict[str, Tensor]):
    """The critic's backbone reloaded (as ``ValueCritic.build`` does) with its adapters and value head loaded."""
    from components.critic import ValueCritic
    from lightning_rl.core.lora import check_base

    critic = ValueCritic(
        init_from=critic_info["init_from"],
        path=critic_info["path"],
        dtype=critic_info["dtype"],
        lora=LoraSpec(**critic_info["lora"]),
    )
    critic.build(info["policy"]["path"], critic_info.get("reward_path"))
    check_base(
        critic_info.get("base_fingerprint"),
        critic.backbone,
        "the checkpoint's critic",
        str(critic_info["path"] or critic_info["init_from"]),
    )
    _load_adapters(critic, trained, "critic")
    return critic


def _load_adapters(model: torch.nn.Module, trained: dict[str, Tensor], what: str) -> None:
    missing, unexpected = model.load_state_dict(trained, strict=False)
    frozen = {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    missing = [k for k in missing if k not in frozen]
    if missing or unexpected:
        raise ValueError(
            f"{what}: the checkpoint's adapters do not fit the LoRA spec recorded with them: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )


def _causal_lm_adapter(model, entry: dict[str, Any], folder: Path, tok) -> None:
    from lightning_rl.core.lora import save_adapter

    # peft picks the model class from task_type, and loads the base from the path written here, from any folder
    base = os.path.expanduser(entry["path"])
    base = os.path.abspath(base) if os.path.isdir(base) else entry["path"]  # a hub id stays as it is
    save_adapter(model, folder, base_path=base, task_type="CAUSAL_LM")
    tok.save_pretrained(folder)


def _value_model_adapter(critic, entry: dict[str, Any], folder: Path, tok) -> None:
    from safetensors.torch import save_file

    from lightning_rl.core.lora import save_adapter

    save_adapter(critic.backbone, folder)
    save_file(
        {k: v.detach().contiguous() for k, v in critic.head.state_dict().items()}, folder / "value_head.safetensors"
    )


KINDS = {
    "causal_lm": ExportKind(_write_causal_lm, _lora_policy, _causal_lm_adapter),
    "value_model": ExportKind(_write_value_model, _lora_critic, _value_model_adapter),
}
"""Export kinds by name (`lightning_rl.roster.Slot.export_as`): ``AutoModelForCausalLM`` (or a vision-language
model's class) + tokenizer; ``AutoModelForTokenClassification`` with one label (a critic: backbone + value head)."""


def merge_adapters(state: dict[str, Tensor], info: dict[str, Any]) -> dict[str, Tensor]:
    """An ``RLModule`` state dict with full weights: LoRA models' adapters merged into their reloaded bases."""
    state = dict(state)
    for slot in _exported(info):
        entry, prefix = info[slot.name], slot.name + "."
        if entry.get("lora") is None:
            continue
        model = KINDS[slot.export_as].lora_model(entry, info, _strip(state, prefix))
        state = {k: v for k, v in state.items() if not k.startswith(prefix)} | {
            prefix + k: v for k, v in merged_state_dict(model).items()
        }
    return state


def export_adapters(
    state: dict[str, Tensor], info: dict[str, Any], out_dir: str | Path, tokenizer: str | None = None
) -> dict[str, Path]:
    """Write the LoRA adapters alone: ``policy/`` (peft adapter + tokenizer) and, for a LoRA critic, ``critic/``."""
    from lightning_rl.core.models import load_tokenizer

    if info["policy"].get("lora") is None:
        raise ValueError(
            "--adapter_only: this checkpoint's policy was trained without LoRA (model.policy.lora is null); export it without --adapter_only"
        )
    out_dir = Path(out_dir)
    tok = load_tokenizer(tokenizer or info["policy"]["tokenizer"], "--tokenizer (the policy's tokenizer)")
    written: dict[str, Path] = {}
    for slot in _exported(info):
        entry, kind = info[slot.name], KINDS[slot.export_as]
        if entry.get("lora") is None:
            continue
        written[slot.name] = out_dir / slot.name
        kind.write_adapter(kind.lora_model(entry, info, _strip(state, slot.name + ".")), entry, written[slot.name], tok)
    return written


def export_reward_model(
    checkpoint: dict[str, Any], out_dir: str | Path, dtype: torch.dtype | None = None
) -> dict[str, Path]:
    """Write the sequence classifier of a ``BradleyTerryRewardModel`` checkpoint to ``out_dir/reward_model``."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from lightning_rl.core.models import load_tokenizer

    path = checkpoint["hyper_parameters"]["path"]
    tok = load_tokenizer(path, "hyper_parameters.path (the reward model's base)")
    config = AutoConfig.from_pretrained(path, num_labels=1)
    config.pad_token_id = tok.pad_token_id
    model = _build(
        AutoModelForSequenceClassification,
        config,
        _cast(_strip(checkpoint["state_dict"], "model."), dtype),
        "reward model",
    )
    target = Path(out_dir) / "reward_model"
    model.save_pretrained(target)
    tok.save_pretrained(target)
    return {"reward_model": target}


def export_checkpoint(
    path: str | Path,
    out_dir: str | Path,
    dtype: str | None = None,
    tokenizer: str | None = None,
    adapter_only: bool = False,
) -> dict[str, Path]:
    """Export every trained model in a checkpoint (or, with ``adapter_only``, its LoRA adapters); returns {name: folder}."""
    from lightning_rl.core.models import DTYPES

    torch_dtype = DTYPES[dtype] if dtype else None
    checkpoint = load_checkpoint(path)
    if "hf_export" in checkpoint and adapter_only:
        return export_adapters(checkpoint["state_dict"], checkpoint["hf_export"], out_dir, tokenizer)
    if "hf_export" in checkpoint:
        return export_state(checkpoint["state_dict"], checkpoint["hf_export"], out_dir, torch_dtype, tokenizer)
    if "path" in (checkpoint.get("hyper_parameters") or {}) and any(
        k.startswith("model.") for k in checkpoint["state_dict"]
    ):
        return export_reward_model(checkpoint, out_dir, torch_dtype)
    raise ValueError(
        f"{str(path)!r} is not a checkpoint of RLModule or BradleyTerryRewardModel (no `hf_export` entry, no reward-model hyper-parameters)"
    )
