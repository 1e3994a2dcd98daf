"""Resume equality helpers shared by the resume, async, distributed, fault and LoRA tests."""

from __future__ import annotations

import torch

from tests.lightning_rl.cli_runs import cli_args, run_cli

KEEP_CHECKPOINTS = ["--trainer.callbacks.save_top_k=-1", "--trainer.callbacks.filename={step}"]


def _fit(root, model_path, steps: int, config: str, extra: list[str], ckpt_path=None):
    resume = [f"--ckpt_path={ckpt_path}"] if ckpt_path else []
    return run_cli("fit", cli_args(root, model_path, steps, *extra, *KEEP_CHECKPOINTS, *resume, config=config))


def assert_same(a, b, path: str = "checkpoint") -> None:
    """Recursive equality of two checkpoint objects; tensors to 1e-6 (fp32), everything else exactly."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        if a.is_floating_point():
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=lambda m: f"{path}: {m}")
        else:
            assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{path}: keys {sorted(set(a) ^ set(b))}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def compared(checkpoint: dict) -> dict:
    """What must match: all of it, except the ModelCheckpoint callback's bookkeeping (it names the run's folder) and
    the count of validation batches (a resumed run does not repeat the validation before training)."""
    out = {k: v for k, v in checkpoint.items() if k not in ("callbacks", "loops")}
    fit_loop = {k: v for k, v in checkpoint["loops"]["fit_loop"].items() if not k.startswith("epoch_loop.val_loop.")}
    out["loops"] = {**checkpoint["loops"], "fit_loop": fit_loop}
    return out


def resume_matches_straight(tmp_path, model_path, config: str, extra: list[str]) -> tuple[dict, dict]:
    _fit(tmp_path / "straight", model_path, 4, config, extra)
    _fit(tmp_path / "stopped", model_path, 2, config, extra)
    stopped_at = tmp_path / "stopped" / "checkpoints" / "step=2.ckpt"
    _fit(tmp_path / "resumed", model_path, 4, config, extra, ckpt_path=stopped_at)

    load = lambda run, step: torch.load(tmp_path / run / "checkpoints" / f"step={step}.ckpt", weights_only=False)  # noqa: E731
    assert_same(compared(load("straight", 2)), compared(load("stopped", 2)))
    straight, resumed = load("straight", 4), load("resumed", 4)
    assert resumed["global_step"] == 4 and resumed["PromptDataModule"]["position"]["batch"] == 4
    assert_same(compared(straight), compared(resumed))
    return straight, load("straight", 2)
