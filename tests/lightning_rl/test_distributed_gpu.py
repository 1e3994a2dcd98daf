"""The strategies on CUDA (NCCL), skipped where there is no GPU: DDP and FSDP2 through the shipped fragments, and
DeepSpeed (CUDA only: Lightning's DeepSpeedStrategy refuses CPU).

    pytest -m gpu tests/lightning_rl/test_distributed_gpu.py     # 1 GPU runs it; 2+ also crosses ranks
    bash benchmarks/deepspeed_smoke.sh                           # ZeRO-2 and ZeRO-3: fit, resume, export

On CPU the same comparisons run on gloo (test_distributed.py) and the fragments are instantiated by
test_distributed_configs.py.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.helpers import needs_cuda
from tests.support.distributed import (
    SEEDED,
    every_step_checkpoints,
    launch,
    no_checkpoints,
    probe_args,
)
from tests.support.resume import assert_same

needs_deepspeed = pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("deepspeed") is None,
    reason="needs a CUDA device and deepspeed",
)


def on_gpu(args: list[str]) -> list[str]:
    return [a.replace("--trainer.accelerator=cpu", "--trainer.accelerator=gpu") for a in args]


@pytest.fixture(scope="module")
def plain_gpu_grpo(tmp_path_factory, tiny_model_path) -> dict:
    root = tmp_path_factory.mktemp("grpo-gpu")
    return launch("configs/grpo.yaml", on_gpu([*probe_args(root, tiny_model_path, 1, 4), *SEEDED, *no_checkpoints()]))


@pytest.mark.gpu
@pytest.mark.slow
@needs_cuda
@pytest.mark.parametrize("fragment", ["configs/strategy/ddp.yaml", "configs/strategy/fsdp.yaml"])
def test_ddp_and_fsdp2_on_gpus_train_as_one_gpu_and_resume(tmp_path, tiny_model_path, plain_gpu_grpo, fragment):
    """NCCL collectives, the strategies' device placement and every rank's CUDA random state in checkpoints: the same
    global batch trains to the same weights as plain one-GPU training (one GPU: one rank), and a run resumed from the
    first iteration's checkpoint samples and trains exactly as the straight run."""
    ranks = min(2, torch.cuda.device_count())

    def run(root, *extra):
        return launch(
            "configs/grpo.yaml",
            on_gpu(
                [
                    *probe_args(root, tiny_model_path, ranks, 4 // ranks),
                    *SEEDED,
                    *every_step_checkpoints(root),
                    "--config",
                    fragment,
                    *extra,
                ]
            ),
        )

    straight = run(tmp_path / "straight")
    assert straight["world_size"] == ranks and straight["rewards"] == pytest.approx(plain_gpu_grpo["rewards"], abs=1e-6)
    assert straight["losses"] == pytest.approx(plain_gpu_grpo["losses"], abs=1e-5)
    for name, value in plain_gpu_grpo["state"].items():
        torch.testing.assert_close(
            straight["state"][name].float(), value.float(), rtol=0, atol=1e-5, msg=lambda m: f"{name}: {m}"
        )
    resumed = run(tmp_path / "resumed", f"--ckpt_path={tmp_path / 'straight' / 'checkpoints' / 'step=1.ckpt'}")
    assert resumed["rewards"] == straight["rewards"][1:] and resumed["losses"] == straight["losses"][1:]
    assert_same(straight["state"], resumed["state"], "state")


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
    plain = launch(
        "configs/grpo.yaml",
        on_gpu([*probe_args(tmp_path / "plain", tiny_model_path, 1, 4), *SEEDED, *micro, *no_checkpoints()]),
    )
    ds_args = [
        *probe_args(tmp_path / "ds", tiny_model_path, ranks, 4 // ranks),
        *SEEDED,
        *micro,
        *no_checkpoints(),
        "--config",
        fragment,
    ]
    deepspeed = launch("configs/grpo.yaml", on_gpu(ds_args))
    assert deepspeed["world_size"] == ranks and deepspeed["rewards"] == pytest.approx(plain["rewards"], abs=1e-6)
    assert deepspeed["losses"] == pytest.approx(plain["losses"], abs=1e-5)
    assert plain["state"].keys() == deepspeed["state"].keys()
    for name, value in plain["state"].items():
        torch.testing.assert_close(
            deepspeed["state"][name].float(), value.float(), rtol=0, atol=1e-5, msg=lambda m: f"{name}: {m}"
        )
