"""Fixtures shared by the SGLang tests of this folder (test_sglang_*.py): the loopback server over the tiny model, its
prompts and a rollout factory. A file that defines a fixture of the same name (a VLM server, ...) uses its own."""

from __future__ import annotations

from dataclasses import replace

import pytest

from components.rollout import SGLangRollout
from components.rollout.server.settings import Servers, Verification
from tests.fixtures.sglang_server import FakeSGLangServer


@pytest.fixture
def server(tiny_model_path):
    srv = FakeSGLangServer(tiny_model_path).start()
    yield srv
    srv.stop()


@pytest.fixture
def prompts(tokenizer):
    enc = tokenizer(["12+3=", "4*5=", "7-2-1="], return_tensors="pt", padding=True)
    assert (enc.attention_mask == 0).any()  # left padding present, to be stripped
    return enc.input_ids, enc.attention_mask


@pytest.fixture
def make_rollout(tokenizer):
    made = []

    def make(servers: Servers, verify: Verification = Verification(every=0), **kwargs):
        """A rollout on ``servers``, retrying after 10 ms, unverified unless ``verify`` says (the probe's requests are
        counted by tests of their own: test_sglang_weight_sync.py)."""
        rollout = SGLangRollout(servers=replace(servers, backoff=0.01), verify=verify, **kwargs)
        rollout.setup(tokenizer)
        made.append(rollout)
        return rollout

    yield make
    for rollout in made:
        rollout.close()
