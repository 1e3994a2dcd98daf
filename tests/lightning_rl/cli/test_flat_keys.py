"""The flat keys of a server rollout and a server teacher of the last release, translated by the command line to their
nested keys (``servers:``, ``weights:``, ``verify:``) before parsing, with one warning line per key
(lightning_rl/cli/flat_keys.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from components.rollout.server.settings import Servers, Verification, WeightPush
from lightning_rl.cli import main
from lightning_rl.cli.flat_keys import NESTED, translate_argv, translate_config_text

REPO = Path(__file__).parents[3]
FLAT = """\
model:
  rollout:
    class_path: components.rollout.SGLangRollout
    init_args:
      group_size: 4
      base_url: http://127.0.0.1:30000/
      timeout_s: 60.0
      max_retries: 1
      weight_sync: distributed
      master_address: 10.0.0.1
      bucket_mb: 64
      verify_every: 2
      verify_tolerance: 0.3
      verify_checksums: false
"""
NESTED_CONFIG = """\
model:
  rollout:
    class_path: components.rollout.SGLangRollout
    init_args:
      group_size: 4
      servers: {urls: [http://127.0.0.1:30000/], timeout_s: 60.0, max_retries: 1}
      weights: {weight_sync: distributed, master_address: 10.0.0.1, bucket_mb: 64}
      verify: {every: 2, tolerance: 0.3, checksums: false}
"""


def _warning(owner: str, flat: str) -> str:
    key = f"model.{owner}.init_args"
    return f"warning: {key}.{flat} is now {key}.{NESTED[flat]}; the flat key goes in the next release"


def _built(*args: str):
    """The components a command line builds (no subcommand: nothing runs, nothing is written)."""
    return main([*args, "--trainer.logger=false", "--trainer.callbacks=null"], run=False)


def _settings(rollout) -> tuple[Servers, WeightPush, Verification]:
    return rollout.connection.servers, rollout.pusher.weights, rollout.pusher.checks.verification


def test_every_flat_key_names_a_field_of_its_settings_object():
    fields = {
        "servers": Servers.__dataclass_fields__,
        "weights": WeightPush.__dataclass_fields__,
        "verify": Verification.__dataclass_fields__,
    }
    for flat, nested in NESTED.items():
        group, field = nested.split(".")
        assert field in fields[group], flat
    assert len(NESTED) == 30  # every flat settings argument ServerRollout took


def test_a_config_file_with_flat_keys_builds_the_settings_of_its_nested_form(tmp_path, capsys):
    (tmp_path / "flat.yaml").write_text(FLAT)
    (tmp_path / "nested.yaml").write_text(NESTED_CONFIG)
    flat = _built("--config", str(tmp_path / "flat.yaml")).model.rollout
    warned = capsys.readouterr().err.strip().splitlines()
    nested = _built("--config", str(tmp_path / "nested.yaml")).model.rollout
    assert capsys.readouterr().err.strip() == ""  # the nested form warns of nothing
    assert _settings(flat) == _settings(nested)
    assert _settings(flat) == (
        Servers(urls=("http://127.0.0.1:30000",), timeout_s=60.0, max_retries=1),
        WeightPush(weight_sync="distributed", master_address="10.0.0.1", bucket_mb=64),
        Verification(every=2, tolerance=0.3, checksums=False),
    )
    assert flat.params == nested.params and flat.params.group_size == 4
    flat_keys = [k for k in yaml.safe_load(FLAT)["model"]["rollout"]["init_args"] if k in NESTED]
    assert warned == [_warning("rollout", k) for k in flat_keys]


def test_flat_keys_on_the_command_line_build_the_nested_settings(capsys):
    cli = _built(
        "--config",
        str(REPO / "configs/rollout/sglang.yaml"),
        "--model.rollout.init_args.base_url=http://h:1",
        "--model.rollout.init_args.verify_every",
        "0",
        "--model.rollout.weight_sync=distributed",  # jsonargparse's short form, without init_args
        "--model.rollout.init_args.master_port=29600",
        "--model.rollout.init_args.launch",
        "null",
    )
    servers, weights, verify = _settings(cli.model.rollout)
    assert servers.urls == ("http://h:1",) and servers.launch is None and servers.max_concurrency == 64
    assert weights == WeightPush(weight_sync="distributed", master_port=29600) and verify == Verification(every=0)
    assert capsys.readouterr().err.strip().splitlines() == [
        _warning("rollout", k) for k in ("base_url", "verify_every", "weight_sync", "master_port", "launch")
    ]


def test_the_command_lines_flat_keys_become_nested_flags_with_base_url_a_list(capsys):
    given = [
        "fit",
        "--model.rollout.init_args.base_url",
        "http://a:1",
        "--model.rollout.init_args.base_url=[http://a:1, http://b:2]",
        "--model.rollout.init_args.base_url=null",
        "--model.rollout.launch.port=30001",
        "--model.rollout.init_args.verify_tolerance=0.2",
        "--model.rollout.init_args.group_size=4",
        "--trainer.max_steps=2",
    ]
    assert translate_argv(given) == [
        "fit",
        "--model.rollout.init_args.servers.urls",
        json.dumps(["http://a:1"]),
        "--model.rollout.init_args.servers.urls=[http://a:1, http://b:2]",
        "--model.rollout.init_args.servers.urls=[]",
        "--model.rollout.servers.launch.port=30001",
        "--model.rollout.init_args.verify.tolerance=0.2",
        "--model.rollout.init_args.group_size=4",
        "--trainer.max_steps=2",
    ]
    assert capsys.readouterr().err.strip().splitlines() == [
        _warning("rollout", k) for k in ("base_url", "base_url", "base_url", "launch", "verify_tolerance")
    ]


def test_a_teachers_flat_server_keys_are_translated_and_nothing_it_never_took():
    assert translate_argv(
        [
            "--model.teacher.init_args.base_url=http://t:1",
            "--model.teacher.init_args.launch.kv_cache_memory_bytes=67108864",
            "--model.teacher.init_args.weight_sync=disk",  # a teacher pushes no weights: left for the parser to refuse
        ]
    ) == [
        '--model.teacher.init_args.servers.urls=["http://t:1"]',
        "--model.teacher.init_args.servers.launch.kv_cache_memory_bytes=67108864",
        "--model.teacher.init_args.weight_sync=disk",
    ]


@pytest.mark.parametrize(
    "named",
    [
        ["--model.rollout=tests.lightning_rl.cli.test_flat_keys.TimedRollout"],
        ["--model.rollout.class_path", "HFRollout"],  # a short name
        ["--config", "{config}"],
    ],
)
def test_a_class_that_is_no_server_rollout_keeps_its_own_key_of_the_same_name(tmp_path, capsys, named):
    config = tmp_path / "timed.yaml"
    config.write_text("model:\n  rollout:\n    class_path: tests.lightning_rl.cli.test_flat_keys.TimedRollout\n")
    named = [arg.format(config=config) for arg in named]
    flag = "--model.rollout.init_args.timeout_s=3"
    assert translate_argv([*named, flag]) == [*named, flag]
    text = config.read_text() + "    init_args: {timeout_s: 3}\n"
    assert translate_config_text(text) == text
    assert capsys.readouterr().err == ""


class TimedRollout:
    """A rollout of someone else's with a ``timeout_s`` of its own (no server rollout)."""

    def __init__(self, timeout_s: float = 1.0):
        self.timeout_s = timeout_s


def test_a_teachers_config_file_nests_its_flat_keys_and_a_null_base_url_is_no_urls(capsys):
    text = (
        "model:\n  teacher:\n    class_path: components.teacher.VLLMTeacher\n    init_args:\n"
        "      base_url: null\n      launch: {dtype: float32}\n      top_k: 8\n      max_retries: 0\n"
    )
    assert yaml.safe_load(translate_config_text(text)) == {
        "model": {
            "teacher": {
                "class_path": "components.teacher.VLLMTeacher",
                "init_args": {"top_k": 8, "servers": {"urls": [], "launch": {"dtype": "float32"}, "max_retries": 0}},
            }
        }
    }
    assert capsys.readouterr().err.strip().splitlines() == [
        _warning("teacher", k) for k in ("base_url", "launch", "max_retries")
    ]
