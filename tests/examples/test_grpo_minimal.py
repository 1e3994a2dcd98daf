"""examples/grpo_minimal.py writes GRPO's phases inline on the components RLModule composes: with the same settings,
the same prompts and the same random stream, both train the same parameters, bit for bit."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from lightning import Trainer

from components.advantage import GroupNormalized
from components.aggregator import TokenMean
from components.reward import ExactMatch
from components.rollout import HFRollout
from components.surrogate import ClippedSurrogate
from lightning_rl import PromptDataModule, RLModule
from lightning_rl.core.config import LoopConfig, OptimizerConfig
from lightning_rl.core.models import TINY_MODEL_PATH

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_minimal.py"


def _example():
    spec = importlib.util.spec_from_file_location("grpo_minimal", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_minimal_script_trains_what_rlmodule_trains():
    iterations, batch_size, seed = 3, 4, 11
    logs: list[str] = []
    policy = _example().train(iterations, batch_size, seed=seed, log=logs.append)
    assert len(logs) == iterations

    module = RLModule(
        rollout=HFRollout(group_size=8, max_new_tokens=8, temperature=1.0),
        reward=ExactMatch(answer_key="answer"),
        advantage=GroupNormalized(scale="group"),
        surrogate=ClippedSurrogate(eps_low=0.2, eps_high=0.2),
        aggregator=TokenMean(),
        optimizer=OptimizerConfig(lr=1e-4, max_grad_norm=1.0),
        loop=LoopConfig(micro_batch_size=64, log_samples_every_n_steps=0),
    )
    torch.manual_seed(seed)
    module.loop_state.rng.state = {"torch": torch.get_rng_state()}  # the iterations sample from the example's stream
    data = PromptDataModule(
        train_data="builtin:arithmetic", val_data=None, tokenizer=TINY_MODEL_PATH, batch_size=batch_size
    )
    trainer = Trainer(
        max_steps=iterations,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, data)

    ours, theirs = module.policy.state_dict(), policy.state_dict()
    assert ours.keys() == theirs.keys()
    initial = {
        k: v for k, v in _example().load_causal_lm(_example().ModelSpec(path=TINY_MODEL_PATH)).state_dict().items()
    }
    assert any(not torch.equal(theirs[k], initial[k]) for k in theirs)  # it trained
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name
