"""Where ``save_state`` and ``save_weights_for_sampler`` write, and the ``tinker://`` paths that name it.

    tinker://<model_id>/weights/<name>          a training state: <checkpoint_dir>/<key>/<model_id>/weights/<name>.ckpt
    tinker://<model_id>/sampler_weights/<name>  sampler weights:  <checkpoint_dir>/<key>/<model_id>/sampler_weights/<name>/

``<key>`` is a digest of the API key that wrote it: a path resolves only for that key, so no client reads or overwrites
another key's checkpoints, and names are plain (letters, digits, ``._-``), so no path leaves its folder.

A training state is our checkpoint format (lightning_rl.checkpoint: written atomically, never with NaN weights, read
back as plain data only): ``state_dict`` holds the trained weights under ``policy.`` (a LoRA client's adapters, a full
client's every weight), ``optimizer_states`` AdamW's state, ``hf_export`` and ``lora_base`` what `lightning-rl export`
needs, so ``lightning-rl export <name>.ckpt out/`` writes the model as a Hugging Face folder. Sampler weights are a
peft adapter folder (``adapter_config.json``, ``adapter_model.safetensors``; its config names the base's folder) or,
for a full client, a ``save_pretrained`` folder with the tokenizer: what vLLM and SGLang load.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from lightning_rl.checkpoint import AtomicCheckpointIO, non_finite_entries, safe_load
from lightning_rl.core.lora import LoraSpec, save_adapter
from lightning_rl.core.models import ModelSpec
from lightning_rl.roster import policy_export_info
from lightning_rl.service.errors import BadRequest, NotFound

KINDS = {"weights": "training", "sampler_weights": "sampler"}
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
PREFIX = "policy."


def tenant_of(api_key: str) -> str:
    """A key's folder name: a digest, so the key itself is written nowhere."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:16]


def check_name(name: str, field: str = "path") -> str:
    if not NAME.match(name) or ".." in name:
        raise BadRequest(
            f"{field} {name!r}: a checkpoint name is 1 to 128 letters, digits, '.', '_' or '-', starting with a letter "
            "or digit",
            field,
        )
    return name


class Storage:
    """Checkpoint folders under ``root``, one per key."""

    def __init__(self, root: str):
        self.root = Path(root).expanduser().resolve()

    def folder(self, tenant: str, model_id: str, kind: str, name: str) -> Path:
        return self.root / tenant / model_id.replace(":", "-") / kind / check_name(name)

    def locate(self, tenant: str, path: str, kind: str | None = None) -> tuple[str, str, str, Path]:
        """(model_id, kind, name, file or folder) of a ``tinker://`` path this key wrote; `NotFound` otherwise."""
        parts = path[len("tinker://") :].split("/") if path.startswith("tinker://") else []
        if len(parts) != 3 or parts[1] not in KINDS:
            raise BadRequest(
                f"path {path!r} is not a tinker://<model_id>/weights/<name> or tinker://<model_id>/sampler_weights/<name> "
                "path",
                "path",
            )
        model_id, found_kind, name = parts
        if kind is not None and found_kind != kind:
            raise BadRequest(
                f"path {path!r} names {KINDS[found_kind]} weights; this call needs {KINDS[kind]} weights", "path"
            )
        target = self.folder(tenant, model_id, found_kind, name)
        target = target.with_suffix(".ckpt") if found_kind == "weights" else target
        if not target.exists():
            raise NotFound(f"no checkpoint at {path!r} for this API key (saved checkpoints are per key)", "path")
        return model_id, found_kind, name, target

    def save_training(self, tenant: str, model, name: str) -> str:
        """Write ``model``'s (a `TrainingModel`) weights and optimizer state; returns its tinker:// path."""
        state = {PREFIX + k: v for k, v in model.trainable_state().items()}
        bad = non_finite_entries(state)
        if bad:
            raise BadRequest(f"{model.model_id} holds NaN or inf weights ({bad[:3]}); nothing was saved", "path")
        spec = ModelSpec(path=model.base.path, lora=model.spec)
        checkpoint = {
            "state_dict": state,
            "optimizer_states": [model.optimizer.state_dict()],
            "hf_export": {"policy": _export_info(model, spec)},
            "tinker": {
                "base_model": model.base.path,
                "lora": None if model.lora is None else dataclasses.asdict(model.lora),
                "lora_spec": None if model.spec is None else dataclasses.asdict(model.spec),
                "steps": model.steps,
            },
        }
        if model.spec is not None:
            checkpoint["lora_base"] = {PREFIX: model.module.lora_base_fingerprint}
        target = self.folder(tenant, model.model_id, "weights", name).with_suffix(".ckpt")
        AtomicCheckpointIO().save_checkpoint(checkpoint, target)
        return f"tinker://{model.model_id}/weights/{name}"

    @staticmethod
    def load_training(file: Path) -> dict:
        checkpoint = safe_load(file)
        if "tinker" not in checkpoint:
            raise BadRequest(f"{file.name} is not a training state written by this service", "path")
        checkpoint["state_dict"] = {k[len(PREFIX) :]: v for k, v in checkpoint["state_dict"].items()}
        return checkpoint

    def save_sampler(self, tenant: str, model_id: str, name: str, snapshot, module) -> str:
        """Write a snapshot's weights (loaded in ``module``) as a folder an inference server loads."""
        folder = self.folder(tenant, model_id, "sampler_weights", name)
        if snapshot.full:
            module.save_pretrained(folder)
            snapshot.base.tokenizer.save_pretrained(folder)
        else:
            save_adapter(module, folder, base_path=snapshot.base.path, task_type="CAUSAL_LM")
        return f"tinker://{model_id}/sampler_weights/{name}"

    @staticmethod
    def load_sampler(folder: Path) -> tuple[str | None, LoraSpec | None, dict[str, torch.Tensor] | None]:
        """(base folder, LoRA spec, adapter tensors named as our models name them) of an adapter folder; for a full
        model folder (None, None, None): the caller loads it as a base."""
        config_file = folder / "adapter_config.json"
        if not config_file.exists():
            return None, None, None
        import json

        config = json.loads(config_file.read_text())
        spec = LoraSpec(
            rank=config["r"], alpha=config["lora_alpha"], dropout=0.0, target_modules=sorted(config["target_modules"])
        )
        tensors = {
            k.removeprefix("base_model.model.").replace(".lora_A.weight", ".lora_A.default.weight").replace(
                ".lora_B.weight", ".lora_B.default.weight"
            ): v
            for k, v in load_file(folder / "adapter_model.safetensors").items()
        }  # fmt: skip
        return config["base_model_name_or_path"], spec, tensors


def _export_info(model, spec: ModelSpec) -> dict:
    """What `lightning-rl export` rebuilds the model from. Adapters on an output head tied to the input embeddings
    (the SDK's ``train_unembed`` on such a base) change the head alone: the exported model unties them, the head
    merged, the embeddings the base's."""
    info = policy_export_info(model.module, spec)
    head = model.module.get_output_embeddings()
    if model.spec is not None and info["config"].get("tie_word_embeddings") and hasattr(head, "lora_A"):
        info["config"] = {**info["config"], "tie_word_embeddings": False}
    return info
