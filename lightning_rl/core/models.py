"""Loading Hugging Face models and tokenizers from a local path or a hub id, with errors that say what to fix."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import torch
from torch import nn

from lightning_rl.core.errors import closest_path
from lightning_rl.core.hf_attributes import context_length, is_vision_language, model_config  # noqa: F401 (context_length: read from here too)
from lightning_rl.core.lora import LoraSpec, apply_lora

TINY_MODEL_PATH = str(Path(__file__).parents[1] / "assets" / "tiny-arith")
"""The embedded default policy: a small causal LM trained on the built-in arithmetic task (scripts/make_tiny_model.py)."""

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelSpec:
    """Where a model comes from and how to load it. Models are built in ``configure_model``, not here."""

    path: str = TINY_MODEL_PATH
    """Local directory with ``config.json`` (``save_pretrained`` output) or a Hugging Face hub id."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype at load time (keep float32 with ``bf16-mixed`` precision)."""
    trust_remote_code: bool = False
    attn_implementation: str | None = None
    """e.g. ``sdpa``, ``eager``, ``flash_attention_2``; None lets transformers choose."""
    gradient_checkpointing: bool = False
    lora: LoraSpec | None = None
    """Train low-rank adapters instead of every weight (None = full fine-tuning); a LoRA policy without a
    ``reference`` scores reference log-probs with its adapters switched off (no second model)."""
    train_vision: bool = False
    """Vision-language policies (Qwen2-VL, Qwen2.5-VL, ...): also train the vision tower and its projector (with
    ``lora``: put adapters there too). False keeps them frozen; only the language model learns."""


@runtime_checkable
class PolicyHolder(Protocol):
    """A LightningModule that trains a policy loaded from a `ModelSpec` (an RLModule, the SFT recipe's): a run's folder
    and its prompts' tokenizer follow the policy's path."""

    policy_spec: ModelSpec


def check_model_path(path: str, what: str) -> None:
    """Fail early, naming the config key, when ``path`` is a local model folder that does not exist (anything that
    cannot be a hub id ``namespace/name`` is one), with the closest folder that does."""
    expanded = os.path.expanduser(path)
    if os.path.isdir(expanded):
        if not os.path.exists(os.path.join(expanded, "config.json")):
            raise FileNotFoundError(
                f"{what}: '{path}' is a directory but has no config.json; point it at a save_pretrained() directory"
            )
        return
    if _local_path(path):
        raise FileNotFoundError(
            f"{what}: model path '{path}' does not exist{_path_hint(path)}; set it to a local save_pretrained() directory "
            "or a hub id (namespace/name)"
        )


def _local_path(path: str) -> bool:
    """Whether ``path`` can only mean a local path: it starts like one, exists, is no valid hub id, or its first folder
    is here."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if path.startswith((".", "/", "~")) or os.path.exists(os.path.expanduser(path)):
        return True
    try:
        validate_repo_id(path)
    except HFValidationError:
        return True
    return "/" in path and os.path.isdir(path.split("/")[0])


def _path_hint(path: str) -> str:
    """`` (did you mean ...?)`` with the closest existing folder; or, for a path relative to the folder holding this
    package (a shipped model named by a preset), where it is."""
    fix = closest_path(path)
    if fix is not None and os.path.isdir(os.path.expanduser(fix)):
        return f" (did you mean '{fix}'?)"
    root = Path(__file__).resolve().parents[2]  # the folder holding lightning_rl: a clone's root
    if not os.path.isabs(os.path.expanduser(path)) and (root / path).is_dir():
        return f" in {os.getcwd()}; it is in {root}: run from there, or give {root / path}"
    return ""


def load_pretrained(loader, path: str, what: str, **kwargs):
    check_model_path(path, what)
    try:
        return loader(os.path.expanduser(path), **kwargs)
    except OSError as err:
        raise OSError(
            f"{what}: could not load '{path}' ({err.__class__.__name__}: {str(err).splitlines()[0]}). "
            "If it is a hub id, this machine may be offline: download it first and pass the local directory."
        ) from err


def load_tokenizer(path: str, what: str = "model.policy.path"):
    from transformers import AutoTokenizer

    tokenizer = load_pretrained(AutoTokenizer.from_pretrained, path, what)
    tokenizer.padding_side = "left"  # generation appends to the right edge of every prompt
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"{what}: tokenizer of '{path}' has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def disable_dropout(model: nn.Module) -> nn.Module:
    """Dropout off everywhere: with it the same policy gives two different log-probs, and the ratio is not 1 before any update."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model


def freeze(model: nn.Module) -> nn.Module:
    model.requires_grad_(False)
    return model.eval()


def policy_class(config):
    """The auto class that builds a policy from ``config``: ``AutoModelForImageTextToText`` for a vision-language
    model (Qwen2-VL, Qwen2.5-VL, LLaVA, ...), ``AutoModelForCausalLM`` otherwise."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING

    if is_vision_language(config) and type(config) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING:
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def vision_prefixes(model: nn.Module) -> list[str]:
    """Names of the modules outside the language model and its output head (a vision-language model's vision tower and
    projector, e.g. ``model.visual``); [] for a text model."""
    if not is_vision_language(model_config(model)):
        return []
    language = [m for m in (model.get_decoder(), model.get_output_embeddings()) if m is not None]
    contains = {id(m) for m in language}
    for m in language:
        contains |= {id(a) for a in _ancestors(model, m)}
    prefixes = []

    def walk(module: nn.Module, name: str) -> None:
        for child_name, child in module.named_children():
            full = f"{name}.{child_name}" if name else child_name
            if any(child is m for m in language):
                continue
            if id(child) in contains:  # holds part of the language model: look inside
                walk(child, full)
            elif any(True for _ in child.parameters()):
                prefixes.append(full)

    walk(model, "")
    return prefixes


def _ancestors(root: nn.Module, target: nn.Module) -> list[nn.Module]:
    for name, module in root.named_modules():
        if module is target:
            parts = name.split(".") if name else []
            return [root.get_submodule(".".join(parts[:i])) for i in range(len(parts))]
    return []


def load_causal_lm(spec: ModelSpec, what: str = "model.policy"):
    """The policy (or reference) model: a causal LM, or a vision-language model whose vision tower stays frozen
    unless ``spec.train_vision``."""
    from transformers import AutoConfig

    kwargs = dict(dtype=DTYPES[spec.dtype], trust_remote_code=spec.trust_remote_code)
    if spec.attn_implementation:
        kwargs["attn_implementation"] = spec.attn_implementation
    config = load_pretrained(
        AutoConfig.from_pretrained, spec.path, f"{what}.path", trust_remote_code=spec.trust_remote_code
    )
    model = load_pretrained(policy_class(config).from_pretrained, spec.path, f"{what}.path", config=config, **kwargs)
    if spec.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = True  # generation needs the KV cache; trainer passes use_cache=False itself
    disable_dropout(model)
    frozen = [] if spec.train_vision else vision_prefixes(model)
    for prefix in frozen:
        model.get_submodule(prefix).requires_grad_(False)
    if spec.lora is not None:  # after disable_dropout: the adapters' own dropout is the spec's choice
        apply_lora(model, spec.lora, what, exclude=frozen)
    return model


def shared_copy(model: nn.Module) -> nn.Module:
    """A second module of ``model``'s class whose parameters and buffers are ``model``'s own tensors (no copy): what
    several LoRA models on one frozen base hold, each injecting adapters of its own into its copy's layers. Exact as
    long as nobody writes the shared tensors (frozen base weights). Tied weights stay tied (the state dict names the one
    tensor twice)."""
    with torch.device("meta"):
        copy = type(model)(model.config)
    copy.load_state_dict(model.state_dict(keep_vars=True), strict=True, assign=True)
    for name, buffer in model.named_buffers():  # non-persistent buffers (rotary frequencies) are not in the state dict
        owner, _, leaf = name.rpartition(".")
        module = copy.get_submodule(owner)
        module.register_buffer(leaf, buffer, persistent=leaf not in module._non_persistent_buffers_set)
    copy.generation_config = model.generation_config
    copy.requires_grad_(False)
    return copy.train(model.training)
