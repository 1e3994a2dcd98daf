"""What a fit says about itself, read where a person reads it: the console of `lightning-rl fit` (its run folder first,
its summary last) and the run's TensorBoard events (histograms, the held-out curve as an image, no curve of a KL that
does nothing); and the progress bar's samples/s, a moving average."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_rl.callbacks.progress import MovingRate
from lightning_rl.callbacks.summary import CURVE_TAG, curve_picture
from tests.helpers import pythonpath
from tests.lightning_rl.cli_runs import cli_args, scalars

ROOT = Path(__file__).resolve().parents[3]


def test_samples_per_second_is_a_moving_average_not_one_iterations_jump():
    """An iteration with a validation inside took 5 s for its 128 samples; its own rate said 25.6 beside the others'
    1,280: the bar shows the samples of the last iterations over their seconds."""
    rate = MovingRate(window=3)
    assert rate.shown({"throughput/samples_per_s": 1280.0}) == {"throughput/samples_per_s": 1280.0}  # none yet
    rate.begin({})
    rate.end({"throughput/samples_per_s": 1280.0, "total/samples": 128.0}, 0.1)  # the first: its own rate
    for total, seconds in ((256.0, 0.1), (384.0, 5.0), (512.0, 0.1)):
        rate.begin({"total/samples": total - 128.0})
        rate.end({"throughput/samples_per_s": 128.0 / seconds, "total/samples": total}, seconds)
    assert rate.samples_per_s == pytest.approx(3 * 128 / 5.2)  # the last three iterations
    assert rate.shown({"throughput/samples_per_s": 1280.0})["throughput/samples_per_s"] == pytest.approx(73.846, 1e-4)


def test_the_held_out_curve_is_a_small_picture_with_a_line_per_set():
    picture = curve_picture([(0, {"val/a/reward": 0.25, "val/b/reward": 0.5}), (50, {"val/a/reward": 0.75})])
    assert picture.size == (360, 220)
    colours = {colour for _, colour in picture.getcolors(360 * 220)}
    assert (31, 119, 180) in colours and (255, 127, 14) in colours  # one colour per set


@pytest.mark.slow
def test_fit_prints_its_run_folder_first_and_its_summary_last_and_tensorboard_has_the_distributions(
    tmp_path, tiny_model_path
):
    # a reward the random policy earns unevenly (updates that run), the sampler's log-probs (the log-prob gaps'
    # histogram) and two epochs (each token is in it once)
    extra = (
        "--model.reward=components.reward.FunctionReward",
        "--model.reward.fn=tests.lightning_rl.rewards.digit_count",
        "--model.rollout.init_args.group_size=4",
        "--model.rollout.init_args.return_logprobs=true",
        "--model.loop.ppo_epochs=2",
    )
    args = cli_args(tmp_path, tiny_model_path, 3, *extra)
    env = {**os.environ, "PYTHONPATH": pythonpath(), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "lightning_rl.cli", "fit", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    said = [line for line in out.stderr.splitlines() if line.strip() and not line.startswith(("Writing", "Loading"))]
    run = "run/version_0"  # under the working folder: named as a config would name it
    assert said[0] == "run folder: run/version_0 (tensorboard --logdir .)", said[:3]
    summary = said[-3:]
    assert re.fullmatch(rf"fit done: 3 RL iterations in 0:\d\d:\d\d \({run}\)", summary[0]), summary
    before, after = (float(v) for v in re.fullmatch(
        r"  held-out val/reward: ([\d.]+) -> ([\d.]+) \(iteration 0 -> 3\)", summary[1]).groups())  # fmt: skip
    logged = scalars(tmp_path)
    held_out = [v for _, v in logged["val/reward"]]  # before the first iteration, at the second, after the last
    assert [round(held_out[0], 3), round(held_out[-1], 3)] == [round(before, 3), round(after, 3)]
    assert summary[2] == "  checkpoint: checkpoints/last.ckpt (--ckpt_path continues the run from it)"
    assert "kl/coef" not in logged  # configs/grpo.yaml's KL has coefficient 0: nothing to plot

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / run), size_guidance={"histograms": 0, "images": 0})
    events.Reload()
    for tag in ("histogram/reward", "histogram/advantage", "histogram/response_length"):
        drawn = events.Histograms(tag)
        assert [h.step for h in drawn] == [0, 1, 2], tag
    # 2 prompts x 4 samples; the advantage of each of their response tokens
    assert events.Histograms("histogram/reward")[0].histogram_value.num == 8
    assert events.Histograms("histogram/response_length")[0].histogram_value.num == 8
    tokens = events.Histograms("histogram/response_length")[0].histogram_value.sum
    assert events.Histograms("histogram/advantage")[0].histogram_value.num == tokens
    # |trainer - sampler| log-prob of each token the update saw, once whatever the epochs
    gaps = events.Histograms("histogram/logprob_diff")
    assert [h.step for h in gaps] == [0, 1, 2]
    for gap, advantage in zip(gaps, events.Histograms("histogram/advantage")):
        assert gap.histogram_value.num == advantage.histogram_value.num
        assert 0 <= gap.histogram_value.min <= gap.histogram_value.max < 1e-3
    (curve,) = events.Images(CURVE_TAG)
    from PIL import Image

    assert curve.step == 3 and Image.open(io.BytesIO(curve.encoded_image_string)).size == (360, 220)
    trace_file = tmp_path / run / "run.log"
    # the command first, by the stage's name
    first = trace_file.read_text().splitlines()[0]
    assert re.match(r"[\d-]+ [\d:]+ fit: \S+ fit --config \S+grpo.yaml --model.policy.path=", first), first
    assert (
        "run folder: run/version_0" in trace_file.read_text() and "fit done: 3 RL iterations" in trace_file.read_text()
    )


@pytest.mark.slow
def test_on_a_terminal_the_summary_is_printed_below_the_bars_last_frame(tmp_path, tiny_model_path):
    """The live bar redraws by moving the cursor up over its own lines: a summary written while it still ran was
    overwritten by its next frame (the console picture showed the bar twice and no summary)."""
    import pty

    args = cli_args(tmp_path, tiny_model_path, 2, "--trainer.enable_progress_bar=true", "--data.val_size=4")
    env = {**os.environ, "PYTHONPATH": pythonpath(), "OMP_NUM_THREADS": "1", "TERM": "xterm-256color", "COLUMNS": "120"}
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "lightning_rl.cli", "fit", *args],
        cwd=tmp_path, env=env, stdin=follower, stdout=follower, stderr=follower,
    )  # fmt: skip
    os.close(follower)
    said = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        said += chunk
    os.close(leader)
    assert process.wait(timeout=600) == 0, said[-3000:].decode(errors="replace")
    summary = said.rindex(b"fit done: 2 RL iterations")
    assert b"RL iterations" in said[:summary]  # the bar was drawn, on the terminal
    assert re.search(rb"\x1b\[\d*A", said[summary:]) is None  # nothing moves the cursor back over the summary
    assert b"checkpoint: checkpoints/last.ckpt" in said[summary:]
