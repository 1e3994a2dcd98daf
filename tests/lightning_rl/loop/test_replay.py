"""Record, then replay (``record_rollouts: true``, ``lightning-rl replay``, lightning_rl.loop.replay): from the same
starting weights a replay of the recorded batches ends with the recorded run's parameters bit for bit, with no
sampler, reward model or environment, for synchronous and asynchronous runs; it logs the same numbers; another
estimator on the same rollouts trains otherwise and says so; a replay starts from a checkpoint of the run, and a
record that kept only its last iterations needs one.

Each run samples with the real HFRollout (temperature 3, a dense reward: every group has something to learn), and
validates before, during and after training (the replay does not: validation draws random numbers of its own, which
the record must not depend on)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

from lightning_rl.rollouts import Record
from tests.lightning_rl.cli_runs import cli_args, run_cli, scalars

REPO = Path(__file__).resolve().parents[3]
DENSE = [
    "--model.reward=components.reward.FunctionReward",
    "--model.reward.fn=tests.lightning_rl.rewards.digit_count",
    "--model.rollout.init_args.temperature=3.0",
]
ASYNC = [
    "--config", str(REPO / "configs/loop/async.yaml"), *DENSE, "--model.rollout.init_args.return_logprobs=true",
]  # fmt: skip
MACHINE = ("time/", "throughput/", "memory/", "async/rollout_s", "val/")
"""Scalars that measure the machine, and validation (which a replay does not run)."""


def lightning_rl(monkeypatch, *args: str) -> None:
    """``lightning-rl ARGS`` through the function the console script calls."""
    from lightning_rl.command import entry

    monkeypatch.setattr("sys.argv", ["lightning-rl", *args])
    monkeypatch.setattr("sys.path", list(sys.path))
    entry()


def record(tmp_path: Path, model_path: str, config: str, extra: list[str], steps: int = 3) -> Path:
    """A run of ``steps`` iterations recording its rollouts; its rollouts folder."""
    run_cli(
        "fit",
        cli_args(
            tmp_path / "rec", model_path, steps, "--record_rollouts=true", "--data.val_size=4", *extra, config=config
        ),
    )
    (folder,) = (tmp_path / "rec" / "run").glob("version_*/rollouts")
    return folder


def replay(monkeypatch, tmp_path: Path, rollouts: Path, *extra: str, into: str = "rep") -> dict:
    """``lightning-rl replay --rollouts ROLLOUTS`` (the record's own config.yaml) into ``tmp_path/into``; its last
    checkpoint."""
    root = tmp_path / into
    lightning_rl(
        monkeypatch,
        "replay",
        "--rollouts", str(rollouts),
        f"--trainer.logger.init_args.save_dir={root}",
        f"--trainer.default_root_dir={root}",
        f"--trainer.callbacks.init_args.dirpath={root}/checkpoints",
        *extra,
    )  # fmt: skip
    return torch.load(root / "checkpoints" / "last.ckpt", weights_only=False)


def checkpoint(tmp_path: Path, name: str = "last.ckpt") -> dict:
    return torch.load(tmp_path / "rec" / "checkpoints" / name, weights_only=False)


def assert_bit_identical(recorded: dict, replayed: dict, left_out: tuple[str, ...] = ()) -> None:
    """Every weight and buffer, and the optimizer's whole state, equal bit for bit (``left_out``: state a replay does
    not carry, e.g. a reward model's running statistics: the reward does not run)."""
    a, b = recorded["state_dict"], replayed["state_dict"]
    assert set(a) == set(b)
    differ = [k for k in a if not k.startswith(left_out) and not torch.equal(a[k], b[k])]
    assert not differ, differ
    for x, y in zip(
        recorded["optimizer_states"][0]["state"].values(), replayed["optimizer_states"][0]["state"].values()
    ):
        assert all(torch.equal(x[k], y[k]) for k in x)
    assert (
        recorded["global_step"] == replayed["global_step"]
        and recorded["optimizer_steps"] == replayed["optimizer_steps"]
    )


def assert_same_scalars(tmp_path: Path) -> None:
    """The replay logs what the run logged, at each iteration: rewards, staleness, losses, KL, clip fractions..."""
    recorded, replayed = scalars(tmp_path / "rec"), scalars(tmp_path / "rep")
    compared = [tag for tag in replayed if not tag.startswith(MACHINE)]
    assert len(compared) > 15 and set(compared) <= set(recorded), sorted(set(compared) - set(recorded))
    differ = [tag for tag in compared if recorded[tag] != replayed[tag]]
    assert not differ, {tag: (recorded[tag], replayed[tag]) for tag in differ}


def assert_trained(recorded: dict, model_path: str) -> None:
    """The recorded run moved the policy (else equal weights would prove nothing)."""
    from safetensors.torch import load_file

    initial = load_file(str(Path(model_path) / "model.safetensors"))
    weight = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(recorded["state_dict"][f"policy.{weight}"], initial[weight])


def said(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_grpo_replayed_from_its_record_is_the_run_bit_for_bit(tmp_path, tiny_model_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    rollouts = record(tmp_path, tiny_model_path, "configs/grpo.yaml", DENSE)
    assert (rollouts / "config.yaml").read_text() == (rollouts.parent / "config.yaml").read_text()
    assert Record(rollouts).iterations == [1, 2, 3]
    replayed = replay(monkeypatch, tmp_path, rollouts)
    recorded = checkpoint(tmp_path)
    assert_trained(recorded, tiny_model_path)
    assert_bit_identical(recorded, replayed)
    assert_same_scalars(tmp_path)
    assert "every field the trainer computed equal the recorded run's" in said(caplog)


@pytest.mark.slow
def test_ppo_rlhf_replayed_without_its_reward_model_is_the_run_bit_for_bit(
    tmp_path, tiny_model_path, monkeypatch, caplog
):
    """Four models, 2 epochs x 2 shuffled mini-batches, the reward model's running normalisation: the replay loads no
    reward model (the record holds its scores), recomputes old and reference log-probs and values, and shuffles the
    mini-batches as the run did."""
    from lightning_rl.recipes.reward_model import save_tiny_reward_model

    caplog.set_level(logging.INFO)
    reward_model = save_tiny_reward_model(tmp_path / "rm", seed=7)
    extra = [
        f"--model.reward.init_args.path={reward_model}",
        "--model.reward.init_args.normalize=running",
        "--model.rollout.init_args.temperature=3.0",
        "--model.loop.ppo_epochs=2",
    ]
    rollouts = record(tmp_path, tiny_model_path, "configs/ppo_rlhf.yaml", extra)
    recorded_batch = Record(rollouts).read(2).batch
    assert recorded_batch.values is not None and recorded_batch.ref_logprobs is not None  # recorded as trained
    replayed = replay(monkeypatch, tmp_path, rollouts)
    recorded = checkpoint(tmp_path)
    assert_trained(recorded, tiny_model_path)
    # the running statistics move as the reward scores: a replay does not score
    assert_bit_identical(recorded, replayed, left_out=("reward.running_",))
    assert replayed["state_dict"]["reward.running_count"] == 0 < recorded["state_dict"]["reward.running_count"]
    assert_same_scalars(tmp_path)
    assert "every field the trainer computed equal the recorded run's" in said(caplog)


@pytest.mark.slow
def test_agent_calc_replayed_without_its_environment_is_the_run_bit_for_bit(tmp_path, monkeypatch, caplog):
    """Multi-turn episodes with the calculator: the record holds the episodes' tokens, which of them the model
    sampled (action_mask), the environment's tokens and rewards, per-token versions and the transcripts."""
    caplog.set_level(logging.INFO)
    tiny_calc = str(REPO / "lightning_rl/assets/tiny-calc")
    rollouts = record(tmp_path, tiny_calc, "configs/agent_calc.yaml", ["--data.batch_size=4"])
    batch = Record(rollouts).read(1).batch
    assert batch.action_mask is not None and (batch.action_mask == 0).any()  # the calculator answered in some episode
    assert "<result>" in "".join(batch.columns["transcripts"])
    replayed = replay(monkeypatch, tmp_path, rollouts)
    recorded = checkpoint(tmp_path)
    assert_trained(recorded, tiny_calc)
    assert_bit_identical(recorded, replayed)
    assert_same_scalars(tmp_path)
    assert "every field the trainer computed equal the recorded run's" in said(caplog)


@pytest.mark.slow
def test_an_asynchronous_run_replayed_trains_each_batch_at_its_recorded_staleness(
    tmp_path, tiny_model_path, monkeypatch, caplog
):
    """configs/loop/async.yaml: each batch was sampled one version before the weights that trained it, and the
    decoupled objective weighs the sampler's log-probs against the trainer's (recomputed as the run did)."""
    caplog.set_level(logging.INFO)
    rollouts = record(tmp_path, tiny_model_path, "configs/grpo.yaml", ASYNC)
    staleness = {it.iteration: (it.version, it.staleness.unique().tolist()) for it in Record(rollouts)}
    assert staleness == {1: (0, [0]), 2: (1, [1]), 3: (2, [1])}  # the second round was sampled by version 0
    replayed = replay(monkeypatch, tmp_path, rollouts)
    recorded = checkpoint(tmp_path)
    assert_trained(recorded, tiny_model_path)
    assert_bit_identical(recorded, replayed)
    assert_same_scalars(tmp_path)
    assert scalars(tmp_path / "rep")["async/staleness_mean"] == scalars(tmp_path / "rec")["async/staleness_mean"]
    assert "every field the trainer computed equal the recorded run's" in said(caplog)


@pytest.mark.slow
def test_random_numbers_drawn_in_the_update_are_the_recorded_ones(tmp_path, tiny_model_path, monkeypatch, caplog):
    """A loss term that draws from torch's random stream in the update, as dropout does: in the run, sampling drew
    from that stream before it; the replay, which samples nothing, starts each update from the state the record holds."""
    caplog.set_level(logging.INFO)
    noisy = ["--model.loss_terms+=tests.support.noisy_loss.RandomTokenNLL", "--model.loop.num_mini_batches=2"]
    rollouts = record(tmp_path, tiny_model_path, "configs/grpo.yaml", [*DENSE, *noisy])
    replayed = replay(monkeypatch, tmp_path, rollouts)
    assert_bit_identical(checkpoint(tmp_path), replayed)
    assert "every field the trainer computed equal the recorded run's" in said(caplog)


@pytest.mark.slow
def test_lora_dropout_is_on_or_off_in_the_update_as_it_was_in_the_run(tmp_path, tiny_model_path, monkeypatch, caplog):
    """The in-process sampler switches the policy to eval mode and back, which decides whether the LoRA adapters'
    dropout runs in the update: the replay, which samples nothing, sets the recorded training flags."""
    caplog.set_level(logging.INFO)
    rollouts = record(tmp_path, tiny_model_path, "configs/grpo_lora.yaml", [*DENSE, "--model.policy.lora.dropout=0.5"])
    replayed = replay(monkeypatch, tmp_path, rollouts)
    assert_bit_identical(checkpoint(tmp_path), replayed)
    assert "every field the trainer computed equal the recorded run's" in said(caplog)


@pytest.mark.slow
def test_another_estimator_on_the_same_rollouts_trains_otherwise_and_says_so(
    tmp_path, tiny_model_path, monkeypatch, caplog
):
    caplog.set_level(logging.INFO)
    rollouts = record(tmp_path, tiny_model_path, "configs/grpo.yaml", DENSE)
    replayed = replay(monkeypatch, tmp_path, rollouts, "--model.advantage=components.advantage.LeaveOneOut")
    recorded = checkpoint(tmp_path)
    text = said(caplog)
    assert "Replaying with other settings than the recorded run's (model.advantage.class_path" in text
    assert "with other settings: not compared with the recorded run" in text and "diverged" not in text
    weight = "policy.model.layers.0.mlp.up_proj.weight"
    assert replayed["global_step"] == 3 and not torch.equal(
        recorded["state_dict"][weight], replayed["state_dict"][weight]
    )
    assert replayed["hf_export"]["policy"]["path"] == tiny_model_path
    # the replay is a run of its own, with its own config: the estimator it trained with, and the record it read
    (config,) = (tmp_path / "rep" / "run").glob("version_*/config.yaml")
    assert "LeaveOneOut" in config.read_text() and f"rollouts: {rollouts}" in config.read_text()


@pytest.mark.slow
def test_a_record_that_kept_its_last_iterations_replays_from_a_checkpoint(
    tmp_path, tiny_model_path, monkeypatch, caplog, capsys
):
    """keep_last: 2 of 4 iterations: the replay starts from the run's checkpoint of iteration 2 and ends where the run
    ended; without the checkpoint it says which iterations the record holds."""
    caplog.set_level(logging.INFO)
    keep = ["--record_rollouts.keep_last=2", "--trainer.callbacks.save_top_k=-1", "--trainer.callbacks.filename={step}"]
    rollouts = record(tmp_path, tiny_model_path, "configs/grpo.yaml", [*DENSE, *keep], steps=4)
    assert Record(rollouts).iterations == [3, 4]
    replayed = replay(monkeypatch, tmp_path, rollouts, f"--ckpt_path={tmp_path}/rec/checkpoints/step=2.ckpt")
    assert_bit_identical(checkpoint(tmp_path, "step=4.ckpt"), replayed)
    assert "Replayed 2 iteration(s)" in said(caplog)
    with pytest.raises(SystemExit):
        replay(monkeypatch, tmp_path, rollouts, into="from_start")
    error = capsys.readouterr().err
    assert "no iteration 1 (it holds 3..4, 2 iterations, the oldest removed by keep_last)" in error
    assert "replay from the run's checkpoint of iteration 2 (--ckpt_path)" in error
