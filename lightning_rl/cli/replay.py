"""`lightning-rl replay --rollouts DIR [--config CONFIG] [fit's options]`: train again from a run's rollout record
(lightning_rl.rollouts), with no engine, no reward and no environment.

    lightning-rl replay --rollouts runs/grpo/version_0/rollouts            # the run's config.yaml, kept beside the record
    lightning-rl replay --config runs/grpo/version_0/config.yaml --rollouts runs/grpo/version_0/rollouts
    lightning-rl replay --rollouts runs/grpo/version_0/rollouts --ckpt_path runs/grpo/version_0/checkpoints/step=50.ckpt
    lightning-rl replay --rollouts runs/grpo/version_0/rollouts --model.surrogate components.surrogate.CISPO

The replay is a new run (``runs/<name>/version_N``) that trains each recorded iteration's batch at the same iteration,
from the config's starting weights (or ``--ckpt_path``'s) through the last iteration recorded (or ``max_steps``), with
no validation. With the recorded run's settings it reproduces its parameters bit for bit, on the same kind of machine,
and checks each iteration against the record. With other settings (another estimator, surrogate, learning rate...) it
says which, and trains them on the same rollouts: the off-policy comparison on identical data.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import yaml
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch.utils.data import DataLoader

from lightning_rl.loop.replay import Ticks
from lightning_rl.rollouts import Record
from lightning_rl.rollouts.record import CONFIG
from lightning_rl.run_setup import begin_run
from lightning_rl.runs import run_folder, shown_path

ROLLOUTS_HELP = "The rollout record to train from: a run's rollouts/ folder (written with record_rollouts: true)"
SAMPLER_SIDE = ("model.rollout", "model.reward", "model.val_reward", "model.agent", "model.sampling")
"""Settings of the collect phase, which a replay does not run: changing them changes nothing it trains."""
TRAINING = ("seed_everything", "model.", "trainer.precision", "trainer.strategy", "trainer.accelerator")
"""What a replay trains with: a difference from the recorded run's config is a replay with other settings."""
NOT_TRAINING = (*SAMPLER_SIDE, "model.loop.log_samples", "model.loop.val_", "model.loop.mask_truncated")


def add_arguments(parser) -> None:
    parser.add_argument("--rollouts", required=True, help=ROLLOUTS_HELP)


def with_recorded_config(args: list[str]) -> list[str]:
    """``replay``'s arguments with ``--config <rollouts>/config.yaml`` first when no ``--config`` is given."""
    if any(a == "--config" or a.startswith("--config=") for a in args):
        return args
    for i, arg in enumerate(args):
        folder = args[i + 1] if arg == "--rollouts" and i + 1 < len(args) else arg.removeprefix("--rollouts=")
        if (arg == "--rollouts" or arg.startswith("--rollouts=")) and (Path(folder) / CONFIG).is_file():
            return ["--config", str(Path(folder) / CONFIG), *args]
    return args


def changed_settings(recorded: dict, replayed: dict) -> list[str]:
    """The config keys that train otherwise in ``replayed`` than in ``recorded`` (both as their YAML loads)."""
    a, b = _flat(recorded), _flat(replayed)
    keys = sorted(k for k in set(a) | set(b) if k.startswith(TRAINING) and not k.startswith(NOT_TRAINING))
    return [k for k in keys if a.get(k) != b.get(k)]


def _flat(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def trainer_settings(config: dict) -> dict:
    """What a replay changes of the Trainer its config builds: it stops at the record's last iteration (or the
    config's ``max_steps``), and does not validate (validation samples, and a replay has no sampler)."""
    last, max_steps = Record(config["rollouts"]).iterations[-1], config["trainer"]["max_steps"]
    return {"max_steps": last if max_steps is None or max_steps < 0 else min(max_steps, last), "limit_val_batches": 0}


def replay(model, trainer, config: dict, dumped: str) -> None:
    """Run ``lightning-rl replay``: ``config`` is the ``replay`` subcommand's (instantiated), ``dumped`` its YAML."""
    record = Record(config["rollouts"])
    if record.config is None:
        changed = []
        rank_zero_info(f"{record.folder} holds no config (the run was composed in Python): replaying with this one")
    else:
        changed = changed_settings(yaml.safe_load(record.config.read_text()), yaml.safe_load(dumped))
    if changed:
        rank_zero_info(
            f"Replaying with other settings than the recorded run's ({', '.join(changed)}): the recorded rollouts are "
            "trained otherwise (an off-policy study), so the parameters will not be the run's"
        )
    model.replay_from(record, reproduces=not changed)
    ckpt_path = begin_run(trainer, "fit", config.get("ckpt_path"), new_run=True, policy_path=model.policy_spec.path)
    with warnings.catch_warnings():  # a replay does not validate: no val_dataloader, by design
        warnings.filterwarnings("ignore", message=".*but have no `val_dataloader`.*")
        trainer.fit(model, train_dataloaders=DataLoader(Ticks(), batch_size=None), ckpt_path=ckpt_path)
    source, folder = model.replay, run_folder(trainer)
    into = f" into {shown_path(folder)}" if folder is not None else ""
    said = f"Replayed {source.replayed} iteration(s) of {shown_path(record.folder)}{into}"
    if changed:
        rank_zero_info(f"{said}, with other settings: not compared with the recorded run")
    elif source.diverged is not None:
        rank_zero_info(f"{said}: it diverged from the recorded run ({source.diverged})")
    else:
        rank_zero_info(
            f"{said}: the weights before each update and every field the trainer computed equal the recorded run's"
        )
