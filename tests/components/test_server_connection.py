"""`Connection` (components/rollout/server/connection.py): what a launch starts."""

from __future__ import annotations

import os

import pytest

from components.rollout import SGLangRollout
from components.rollout.sglang.engine import SGLangEngine


def test_a_launch_that_names_no_checkpoint_serves_the_policys(tokenizer, tiny_model_path):
    launched = {}

    class Capturing(SGLangEngine):
        @classmethod
        def command(cls, launch, python):
            launched.update(launch)
            raise RuntimeError("not started")

    class Rollout(SGLangRollout):
        engine_type = Capturing

    with pytest.raises(RuntimeError, match="not started"):
        Rollout(launch={"mem_fraction_static": 0.5}).setup(tokenizer)  # the tokenizer is the policy's
    assert launched == {"mem_fraction_static": 0.5, "model_path": os.path.abspath(tiny_model_path)}
    with pytest.raises(RuntimeError, match="not started"):
        Rollout(launch={"model_path": "/elsewhere"}).setup(tokenizer)
    assert launched["model_path"] == "/elsewhere"  # named: kept
