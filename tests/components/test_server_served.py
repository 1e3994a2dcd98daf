"""A server that serves another model than the policy (components.rollout.server.served) is refused once its servers
are connected and the policy is known, before any request or push: its architecture, its vocabulary, a weight a push
sends that its checkpoint lacks, or one of another shape, in one line. The same model passes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from components.rollout.server.served import Served, checkpoint_tensors, served_mismatch
from lightning_rl.core.models import TINY_MODEL_PATH, ModelSpec, load_causal_lm


@pytest.fixture(scope="module")
def policy():
    return load_causal_lm(ModelSpec(path=TINY_MODEL_PATH))  # tiny-arith: Llama, 18 tokens, 4 layers


def _copy(tmp_path, change) -> str:
    """tiny-arith's checkpoint with ``change(config, tensors)`` applied."""
    folder = tmp_path / "served"
    shutil.copytree(TINY_MODEL_PATH, folder)
    config = json.loads((folder / "config.json").read_text())
    (file,) = folder.glob("*.safetensors")
    tensors = load_file(file)
    change(config, tensors)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, file)
    return str(folder)


def test_the_policys_own_checkpoint_passes(policy):
    assert served_mismatch(policy, Served(str(TINY_MODEL_PATH), ["LlamaForCausalLM"])) is None
    assert len(checkpoint_tensors(Path(TINY_MODEL_PATH))) == 38  # every parameter, lm_head tied to the embedding
    assert served_mismatch(policy, Served("/not/on/this/machine", None)) is None  # nothing says otherwise
    assert served_mismatch(policy, Served(None, None)) is None


def test_another_architecture_is_named(policy):
    reason = served_mismatch(policy, Served("/elsewhere", ["Qwen2ForCausalLM"]))
    assert reason == "its architecture is Qwen2ForCausalLM, the policy's LlamaForCausalLM"
    teacher = str(TINY_MODEL_PATH).replace("tiny-arith", "tiny-arith-teacher")  # read from its config.json
    assert served_mismatch(policy, Served(teacher)) == reason


def test_another_vocabulary_is_named(policy):
    calc = str(TINY_MODEL_PATH).replace("tiny-arith", "tiny-calc")
    assert (
        served_mismatch(policy, Served(calc, ["LlamaForCausalLM"])) == "its vocabulary has 22 tokens, the policy's 18"
    )


def test_a_weight_the_checkpoint_lacks_is_named(policy, tmp_path):
    def drop_a_layer(config, tensors):
        for name in [n for n in tensors if n.startswith("model.layers.3.")]:
            del tensors[name]

    reason = served_mismatch(policy, Served(_copy(tmp_path, drop_a_layer)))
    assert reason.startswith("9 of the 38 weights a push sends are not in its checkpoint (e.g. model.layers.3.")


def test_a_weight_of_another_shape_is_named(policy, tmp_path):
    def wider_mlp(config, tensors):
        for part in ("gate_proj", "up_proj"):
            tensors[f"model.layers.1.mlp.{part}.weight"] = torch.zeros(300, 128)
        tensors["model.layers.1.mlp.down_proj.weight"] = torch.zeros(128, 300)

    reason = served_mismatch(policy, Served(_copy(tmp_path, wider_mlp)))
    assert reason.startswith("3 weights have another shape (e.g. model.layers.1.mlp.")
    assert "[300, 128] there" in reason or "[128, 300] there" in reason
