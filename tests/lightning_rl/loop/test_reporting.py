"""What an iteration writes to TensorBoard besides the means: reward and response length min / max, samples and
tokens so far (continued by a resumed run), the iteration's wall time, peak memory; each in the Custom Scalars layout."""

from __future__ import annotations

import re
import resource
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from torch.utils.tensorboard import SummaryWriter

from lightning_rl.core.config import LoopConfig
from lightning_rl.loop.health import TrainingHealth
from lightning_rl.loop.metrics import PhaseTimer, WeightedMeans
from lightning_rl.loop.reporting import LAYOUT, Reporter
from tests.helpers import batch_from_scores
from tests.lightning_rl.cli_runs import cli_args, run_cli, scalars

NEW_TAGS = (
    "reward/min",
    "reward/max",
    "response_length/min",
    "response_length/max",
    "total/samples",
    "total/tokens",
    "time/iteration_s",
    "memory/peak_rss_mib",
)


class _Logger:
    experiment = None  # draws nothing (a TensorBoard logger's is a SummaryWriter)

    def __init__(self):
        self.logged: list[tuple[int, dict]] = []

    def log_metrics(self, metrics, step):
        self.logged.append((step, dict(metrics)))


def _trainer(step: int, logger: _Logger):
    return SimpleNamespace(
        callback_metrics={},
        logged_metrics={},
        global_rank=0,
        global_step=step,
        logger=logger,
        loggers=[logger],
        log_every_n_steps=1,
        progress_bar_callback=None,
    )


def _reporter(totals=None) -> Reporter:
    loop = LoopConfig(log_samples_every_n_steps=0)
    return Reporter(
        loop,
        TrainingHealth(0, 0, 0.0),
        tokenizer=None,
        kl_coef=None,
        group_size=2,
        filters_groups=False,
        shapes_reward=False,
        recompute_old=False,
        totals=totals if totals is not None else {},
    )


def _iteration(reporter, step, batch, logger, sleep_s=0.0):
    timer = PhaseTimer()
    with timer("rollout"):
        time.sleep(sleep_s)
    time.sleep(sleep_s)  # between the phases: the iteration's wall time has it, no phase does
    reporter.iteration(_trainer(step, logger), batch, WeightedMeans(), timer, 1e-4, log=None)
    return logger.logged[-1][1]


def test_min_max_of_the_sampled_rows_totals_wall_time_and_memory():
    # 2 groups of 2 sampled rows and a greedy baseline row (ReMax) each, whose score and length count in no statistic
    batch = batch_from_scores(
        [1.0, 0.0, 5.0, 0.5, 0.25, 7.0],
        lengths=[2, 1, 6, 3, 2, 6],
        group_size=3,
        is_greedy=torch.tensor([0, 0, 1, 0, 0, 1]),
        truncated=torch.zeros(6, dtype=torch.bool),
    )
    reporter, logger = _reporter(), _Logger()
    first = _iteration(reporter, 1, batch, logger, sleep_s=0.05)
    assert (first["reward/min"], first["reward/max"]) == (0.0, 1.0)
    assert (first["response_length/min"], first["response_length/max"]) == (1.0, 3.0)
    assert first["time/iteration_s"] >= first["time/rollout_s"] + 0.05
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (
        1024 if sys.platform != "darwin" else 1024 * 1024
    )  # KiB on Linux
    assert first["memory/peak_rss_mib"] == pytest.approx(peak, rel=0.05)
    assert "memory/peak_cuda_allocated_mib" not in first  # a CPU run
    # every row sampled counts (the greedy one too: it was generated), and the totals keep growing
    assert (first["total/samples"], first["total/tokens"]) == (6.0, 20.0)
    second = _iteration(reporter, 2, batch, logger)
    assert (second["total/samples"], second["total/tokens"]) == (12.0, 40.0)


def test_an_empty_batch_writes_no_extremes():
    batch = batch_from_scores([1.0, 0.0], group_size=2, truncated=torch.zeros(2, dtype=torch.bool)).select(
        torch.tensor([], dtype=torch.long)
    )
    written = _iteration(_reporter(), 1, batch, _Logger())
    assert not {"reward/min", "reward/max", "response_length/min", "response_length/max"} & set(written)
    assert written["total/samples"] == 0.0


def test_every_new_tag_has_a_chart_in_the_custom_scalars_layout():
    patterns = [p for group in LAYOUT.values() for _, regexes in group.values() for p in regexes]
    for tag in (*NEW_TAGS, "memory/peak_cuda_allocated_mib", "memory/peak_cuda_reserved_mib"):
        assert any(re.search(p, tag) for p in patterns), tag
    charts = {title: regexes for group in LAYOUT.values() for title, (_, regexes) in group.items()}
    reward_chart = next(r for t, r in charts.items() if t.startswith("reward"))
    assert any(re.search(p, "reward/min") for p in reward_chart) and any(
        re.search(p, "reward/accuracy") for p in reward_chart
    )
    assert not any(re.search(p, "reward/std") for p in reward_chart)


@pytest.mark.slow
def test_a_resumed_run_continues_the_totals(tmp_path, tiny_model_path):
    run_cli("fit", cli_args(tmp_path, tiny_model_path, 2, "--data.val_data=null"))
    logged = scalars(tmp_path)
    assert logged["total/samples"] == [(0, 16.0), (1, 32.0)]  # 2 prompts x 8 samples per iteration
    for tag in NEW_TAGS:
        assert len(logged[tag]) == 2, tag
    # the checkpoint folder is outside the run's (cli_args): the resumed run gets a version of its own, counting on
    run_cli(
        "fit",
        cli_args(tmp_path, tiny_model_path, 3, "--data.val_data=null", f"--ckpt_path={tmp_path}/checkpoints/last.ckpt"),
    )
    assert scalars(tmp_path)["total/samples"] == [(2, 48.0)]


class _Experiment(SummaryWriter):
    """What TensorBoard's SummaryWriter is asked: histograms by tag, with their step and values (no events written)."""

    def __init__(self):  # a writer that writes nothing: SummaryWriter's own would open an event file
        self.histograms: dict[str, list[tuple[int, list[float]]]] = {}

    def add_histogram(self, tag, values, step):
        self.histograms.setdefault(tag, []).append((step, sorted(float(v) for v in values)))

    def add_custom_scalars(self, layout):
        pass


def test_histograms_of_rewards_lengths_advantages_and_logprob_gaps_at_the_scalars_step():
    # 3 sampled rows and a greedy baseline row; advantages on each row's valid tokens only
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]])
    batch = batch_from_scores(
        [1.0, 0.0, 0.5, 9.0],
        lengths=[2, 1, 3, 2],
        is_greedy=torch.tensor([0, 0, 0, 1]),
        truncated=torch.zeros(4, dtype=torch.bool),
        advantages=torch.tensor([[0.5, 0.5, 7.0], [-0.5, 7.0, 7.0], [0.0, 0.0, 0.0], [7.0, 7.0, 7.0]]),
    ).replace(sample_mask=torch.tensor([1.0, 1.0, 1.0, 0.0]))  # the baseline row is never in the loss
    assert torch.equal(batch.response_mask, mask)
    logger = _Logger()
    logger.experiment = _Experiment()
    metrics = WeightedMeans()
    metrics.values("histogram/logprob_diff", torch.tensor([1e-6, 3e-6]))  # what the update's first epoch adds
    trainer = _trainer(5, logger)
    _reporter().iteration(trainer, batch, metrics, PhaseTimer(), 1e-4, log=None)
    drawn = logger.experiment.histograms
    assert drawn["histogram/reward"] == [(4, [0.0, 0.5, 1.0])]  # the step of the scalars: iterations before this one
    assert drawn["histogram/response_length"] == [(4, [1.0, 2.0, 3.0])]
    # every token the update saw (batch.loss_mask)
    assert drawn["histogram/advantage"] == [(4, sorted([0.5, 0.5, -0.5, 0.0, 0.0, 0.0]))]
    assert drawn["histogram/logprob_diff"] == [(4, [pytest.approx(1e-6), pytest.approx(3e-6)])]
    # at Lightning's cadence, as the scalars
    trainer.log_every_n_steps, trainer.global_step = 2, 7
    _reporter().iteration(trainer, batch, WeightedMeans(), PhaseTimer(), 1e-4, log=None)
    assert len(drawn["histogram/reward"]) == 1


def test_kl_coef_is_written_only_where_a_kl_acts():
    from components.kl import KLRegularizer

    batch = batch_from_scores([1.0, 0.0], group_size=2, truncated=torch.zeros(2, dtype=torch.bool))
    for kl, written in ((None, False), (KLRegularizer(coef=0.0), False), (KLRegularizer(coef=0.05), True)):
        reporter = _reporter()
        reporter.kl_coef = None if kl is None or not kl.active else (lambda kl=kl: kl.coef)
        assert ("kl/coef" in _iteration(reporter, 1, batch, _Logger())) == written
