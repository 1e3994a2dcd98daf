"""Every strategy fragment stacks on the presets and builds its strategy (the runs are in test_distributed*.py)."""

from __future__ import annotations

import pytest
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy

from lightning_rl.checkpoint import AtomicCheckpointIO
from lightning_rl.cli import DEFAULT_TRAINER_CONFIG, main
from lightning_rl.distributed import FSDP2Strategy

PRESETS = ["configs/grpo.yaml", "configs/ppo_rlhf.yaml", "configs/vc_ppo.yaml", "configs/dapo.yaml"]


def build(*configs: str, extra: tuple[str, ...] = ()):
    args = ["--config", DEFAULT_TRAINER_CONFIG]
    for config in configs:
        args += ["--config", config]
    return main([*args, "--trainer.logger=false", "--trainer.callbacks=null", *extra], run=False)


@pytest.mark.parametrize("preset", PRESETS)
def test_ddp_fragment(preset):
    cli = build(preset, "configs/strategy/ddp.yaml")
    strategy = cli.trainer.strategy
    assert isinstance(strategy, DDPStrategy) and strategy._ddp_kwargs["find_unused_parameters"] is False
    assert isinstance(strategy.checkpoint_io, AtomicCheckpointIO)  # the CLI's default CheckpointIO


@pytest.mark.parametrize("preset", PRESETS)
def test_fsdp_fragment(preset):
    strategy = build(preset, "configs/strategy/fsdp.yaml").trainer.strategy
    assert isinstance(strategy, FSDP2Strategy) and strategy.sharding == "all"


@pytest.mark.parametrize(
    ("fragment", "stage"), [("configs/strategy/deepspeed.yaml", 2), ("configs/strategy/deepspeed_zero3.yaml", 3)]
)
def test_deepspeed_fragments(fragment, stage):
    pytest.importorskip("deepspeed")
    # the fragments ask for a GPU; on a CPU host only the construction is checked (DeepSpeed refuses CPU at setup)
    strategy = build("configs/grpo.yaml", fragment, extra=("--trainer.accelerator=cpu",)).trainer.strategy
    assert isinstance(strategy, DeepSpeedStrategy)
    config = strategy.config
    assert config["zero_optimization"]["stage"] == stage
    # unmanaged accumulation (the module calls step()) exists for ZeRO 0-2; ZeRO-3 accumulates until step() by itself
    assert config.get("managed_gradient_accumulation") is (False if stage == 2 else None)
    assert config["gradient_clipping"] == 1.0 and config["gradient_accumulation_steps"] == 1


def test_fsdp_sharding_option_is_checked():
    with pytest.raises(ValueError, match="sharding must be 'all' or 'node'"):
        FSDP2Strategy(sharding="rows")
