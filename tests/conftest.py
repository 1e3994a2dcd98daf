"""Shared fixtures: tiny models built locally (nothing is downloaded) and batch builders."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# at most 2 threads, shared out among pytest-xdist's workers (more threads than cores only wait on each other)
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, torch.get_num_threads() // _WORKERS)))


def pytest_configure(config):
    from tests.support import tiers

    tiers.install()


@pytest.hookimpl(tryfirst=True)  # before -m selects by the markers
def pytest_collection_modifyitems(config, items):
    from tests.support.tiers import arrange

    arrange(config, items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    from tests.support.tiers import watching

    with watching(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    from tests.support.tiers import watching

    with watching(item):
        result = yield
    # every tag a run of the test logged is in docs/reference.md's metrics tables (tests/support/metric_tags.py)
    folder = getattr(item, "funcargs", {}).get("tmp_path")
    if folder is not None:
        from tests.support.metric_tags import check_run_folders

        try:
            check_run_folders(folder)
        except AssertionError as error:
            pytest.fail(f"{item.nodeid}: {error}", pytrace=False)
    return result


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> str:
    """A random 2-layer, hidden-32 character-level Llama with the built-in task's tokenizer."""
    from lightning_rl.recipes.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny-llama"), hidden_size=32, layers=2, heads=2, seed=0)


@pytest.fixture(scope="session")
def tiny_model_path_b(tmp_path_factory) -> str:
    """A second tiny model with different weights (a reference that differs from the policy)."""
    from lightning_rl.recipes.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny-llama-b"), hidden_size=32, layers=2, heads=2, seed=1)


@pytest.fixture
def tokenizer(tiny_model_path):
    from lightning_rl.core.models import load_tokenizer

    return load_tokenizer(tiny_model_path)


@pytest.fixture(scope="session")
def tiny_vlm_path(tmp_path_factory) -> str:
    """A random tiny Qwen2-VL (2 layers, hidden 32, a 1-block vision tower) with a character-level chat tokenizer."""
    from lightning_rl.recipes.tiny_vlm import save_tiny_vlm

    return save_tiny_vlm(tmp_path_factory.mktemp("tiny-qwen2-vl"), "qwen2_vl", seed=0)


@pytest.fixture(scope="session")
def tiny_vlm25_path(tmp_path_factory) -> str:
    """The same, as a Qwen2.5-VL (windowed vision attention, gated vision MLP)."""
    from lightning_rl.recipes.tiny_vlm import save_tiny_vlm

    return save_tiny_vlm(tmp_path_factory.mktemp("tiny-qwen2_5-vl"), "qwen2_5_vl", seed=0)


@pytest.fixture(scope="session")
def tiny_vlm3_path(tmp_path_factory) -> str:
    """The same, as a Qwen3-VL (16-pixel patches, interleaved multimodal rotary positions, deepstack features)."""
    from lightning_rl.recipes.tiny_vlm import save_tiny_vlm

    return save_tiny_vlm(tmp_path_factory.mktemp("tiny-qwen3-vl"), "qwen3_vl", seed=0)


from tests.fixtures.vllm_server import vllm_moe_server, vllm_server  # noqa: E402, F401 (the run's real vLLM servers, session-scoped)


@pytest.fixture(scope="session")
def tiny_moe_path(tmp_path_factory) -> str:
    """A random 2-layer Qwen3-MoE (4 experts, 2 per token, hidden 64) with the built-in task's tokenizer."""
    from tests.support.moe import save_moe

    return save_moe(tmp_path_factory.mktemp("tiny-moe"), "qwen3_moe")
