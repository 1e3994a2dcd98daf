"""DeepSpeed (CUDA only: Lightning's DeepSpeedStrategy refuses CPU), skipped where there is no GPU.

    pytest -m gpu tests/lightning_rl/test_distributed_gpu.py     # 1 GPU runs it; 2+ also crosses ranks
    bash benchmarks/deepspeed_smoke.sh                           # ZeRO-2 and ZeRO-3: fit, resume, export

On CPU the fragments are instantiated by test_distributed_configs.py.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from .test_distributed import SEEDED, launch, no_checkpoints, probe_args

needs_deepspeed = pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("deepspeed") is None, reason="needs a CUDA device and deepspeed"
)


def on_gpu(args: list[str]) -> list[str]:
    return [a.replace("--trainer.accelerator=cpu", "--trainer.accelerator=gpu") for a in args]


@pytest.mark.gpu
@pytest.mark.slow
@needs_deepspeed
@pytest.mark.parametrize("fragment", ["configs/strategy/deepspeed.yaml", "configs/strategy/deepspeed_zero3.yaml"])
def test_deepspeed_grpo_steps_equal_plain_training(tmp_path, tiny_model_path, fragment):
    """One optimizer, DeepSpeed's clipping (1.0, as the preset's; GRPO has one parameter group) and the module's
    accumulation over 4 micro-batches per step (managed_gradient_accumulation: false): the same losses and
    parameters as the same global batch trained on one GPU without DeepSpeed."""
    ranks = min(2, torch.cuda.device_count())
    micro = ["--model.loop.micro_batch_size=4"]
    plain = launch("configs/grpo.yaml", on_gpu([*probe_args(tmp_path / "plain", tiny_model_path, 1, 4), *SEEDED, *micro, *no_checkpoints()]))
    ds_args = [*probe_args(tmp_path / "ds", tiny_model_path, ranks, 4 // ranks), *SEEDED, *micro, *no_checkpoints(), "--config", fragment]
    deepspeed = launch("configs/grpo.yaml", on_gpu(ds_args))
    assert deepspeed["world_size"] == ranks and deepspeed["rewards"] == pytest.approx(plain["rewards"], abs=1e-6)
    assert deepspeed["losses"] == pytest.approx(plain["losses"], abs=1e-5)
    assert plain["state"].keys() == deepspeed["state"].keys()
    for name, value in plain["state"].items():
        torch.testing.assert_close(deepspeed["state"][name].float(), value.float(), rtol=0, atol=1e-5, msg=lambda m: f"{name}: {m}")
