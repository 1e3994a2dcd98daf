"""Asynchronous training (loop.max_staleness, lightning_rl.loop.ahead): the bound, the dropped samples, resume with rounds
in flight, a dead server, and max_staleness 0 as the synchronous loop."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from components.rollout.server.settings import Servers, WeightPush
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.models import ModelSpec, load_causal_lm
from lightning_rl.loop.ahead import drop_stale
from lightning_rl.loop.collect import Collector
from lightning_rl.loop.module import RLModule
from tests.helpers import CUDA_BF16, cpu_and_cuda
from tests.lightning_rl.cli_runs import cli_args, run_cli, scalars
from tests.support.resume import assert_same, compared

REPO = Path(__file__).resolve().parents[3]
DENSE_REWARD = [
    "--model.reward=components.reward.FunctionReward",
    "--model.reward.fn=tests.lightning_rl.rewards.digit_count",
]
ASYNC = [
    "--config", str(REPO / "configs/loop/async.yaml"),
    *DENSE_REWARD,
    "--model.rollout.init_args.return_logprobs=true",
    "--model.rollout.init_args.temperature=3.0",
]  # fmt: skip
KEEP = ["--trainer.callbacks.save_top_k=-1", "--trainer.callbacks.filename={step}"]


def test_stale_groups_are_dropped_whole_and_counted():
    # trainer at version 3, bound 1: group 1 (version 1, staleness 2) goes; groups 0 (staleness 0) and 2 (1) stay
    batch = RolloutBatch(
        response_ids=torch.ones(6, 2, dtype=torch.long),
        response_mask=torch.ones(6, 2, dtype=torch.long),
        group_ids=torch.tensor([0, 0, 1, 1, 2, 2]),
        versions=torch.tensor([3, 3, 1, 2, 2, 2]),
        scores=torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0]),
    )
    batch = batch.replace(columns={"completions": list("abcdef")})
    kept, metrics = drop_stale(batch, version=3, max_staleness=1)
    assert kept.group_ids.tolist() == [0, 0, 2, 2] and kept.scores.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert kept.columns == {"completions": ["a", "b", "e", "f"]}
    assert float(metrics["async/dropped_frac"]) == pytest.approx(2 / 6)
    assert float(metrics["async/staleness_mean"]) == pytest.approx(0.5) and int(metrics["async/staleness_max"]) == 1
    same, metrics = drop_stale(batch, version=3, max_staleness=2)
    assert same is batch and float(metrics["async/dropped_frac"]) == 0.0


def test_staleness_without_a_correction_warns_and_a_negative_bound_is_refused():
    from components.surrogate import ClippedSurrogate, DecoupledClip
    from lightning_rl.core.config import LoopConfig

    with pytest.warns(UserWarning, match="nothing corrects for their staleness"):
        RLModule(surrogate=ClippedSurrogate(), loop=LoopConfig(max_staleness=1))
    with pytest.raises(
        ValueError, match="return_logprobs: true"
    ):  # DecoupledClip reads the sampler's log-probs: HFRollout must report them
        RLModule(surrogate=DecoupledClip(), loop=LoopConfig(max_staleness=1))
    with pytest.raises(ValueError, match="max_staleness=-1"):
        LoopConfig(max_staleness=-1)


def test_a_server_rollout_that_releases_its_memory_is_refused_before_the_first_round():
    """release_memory: true gives the servers' memory back between rollouts, so they cannot sample ahead while the
    trainer trains: refused when fit starts (the guard read rollout.release_memory, which had moved to
    rollout.weights, and its default let every such run through to fail at iteration 3)."""
    from types import SimpleNamespace

    from components.rollout import SGLangRollout
    from lightning_rl.loop.ahead import check_asynchronous

    trainer = SimpleNamespace(world_size=1, strategy=None)
    rollout = SGLangRollout(
        servers=Servers(urls=("http://127.0.0.1:9",)), weights=WeightPush(release_memory=True)
    )  # nothing is contacted here
    with pytest.raises(
        ValueError, match=r"release_memory: true\): set weights\.release_memory: false, or max_staleness: 0"
    ):
        check_asynchronous(rollout, trainer)
    check_asynchronous(SGLangRollout(servers=Servers(urls=("http://127.0.0.1:9",))), trainer)


@pytest.mark.slow
def test_max_staleness_zero_is_the_synchronous_loop(tmp_path, tiny_model_path):
    run_cli("fit", cli_args(tmp_path / "sync", tiny_model_path, 3, *KEEP, "--model.rollout.init_args.temperature=3.0"))
    run_cli(
        "fit",
        cli_args(
            tmp_path / "zero",
            tiny_model_path,
            3,
            *KEEP,
            "--model.rollout.init_args.temperature=3.0",
            "--model.loop.max_staleness=0",
        ),
    )
    load = lambda run: torch.load(tmp_path / run / "checkpoints" / "step=2.ckpt", weights_only=False)  # noqa: E731
    assert_same(compared(load("sync")), compared(load("zero")))
    assert "async/staleness_mean" not in scalars(tmp_path / "zero")


@pytest.mark.slow
@pytest.mark.parametrize("hardware", cpu_and_cuda([], CUDA_BF16))
def test_staleness_one_trains_within_the_bound_and_logs_it(tmp_path, tiny_model_path, hardware):
    """Also on CUDA: the round sampled ahead runs on a thread of its own, from the sampler's own copy of the policy."""
    cli = run_cli("fit", cli_args(tmp_path, tiny_model_path, 5, *ASYNC, *hardware))
    assert cli.trainer.global_step == 5
    logged = scalars(tmp_path)
    staleness = [v for _, v in logged["async/staleness_max"]]
    assert staleness == [
        0.0,
        1.0,
        1.0,
        1.0,
        1.0,
    ]  # the first round is sampled by the first weights; each later one, a version behind
    assert all(v == 0.0 for _, v in logged["async/dropped_frac"])
    for tag in (
        "async/staleness_mean",
        "time/rollout_wait_s",
        "time/sync_s",
        "async/rollout_s",
        "policy/behaviour_weight_mean",
    ):
        assert tag in logged, tag
    # the checkpoint's data position is that of the first round not trained, not of the last one requested
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["PromptDataModule"]["position"] == {"epoch": 0, "batch": 5}


@pytest.mark.slow
def test_one_step_per_batch_takes_pi_prox_from_the_updates_own_forward_and_trains_the_same(
    tmp_path, tiny_model_path, monkeypatch
):
    """With one epoch and one mini-batch the update's forward runs on pi_prox's weights, also on a batch sampled a
    version behind: no log-prob pass of its own, and the weights it trains equal those of a run that recomputes."""
    build = RLModule.configure_model
    trained = {}
    for name, recompute in [("taken", False), ("recomputed", True)]:

        def configure_model(self, _recompute=recompute):
            assert self.recompute_old is False  # one step per batch, nothing reads pi_old before the update
            self.recompute_old = _recompute
            build(self)

        monkeypatch.setattr(RLModule, "configure_model", configure_model)
        cli = run_cli("fit", cli_args(tmp_path / name, tiny_model_path, 3, *ASYNC))
        logged = scalars(tmp_path / name)
        assert [v for _, v in logged["policy/old_logprobs_recomputed"]] == [float(recompute)] * 3
        assert [v for _, v in logged["async/staleness_max"]] == [0.0, 1.0, 1.0]
        trained[name] = {k: v.detach().clone() for k, v in cli.model.policy.state_dict().items()}
    start = load_causal_lm(ModelSpec(path=tiny_model_path)).state_dict()
    for key, weight in trained["taken"].items():
        torch.testing.assert_close(weight, trained["recomputed"][key], atol=1e-6, rtol=0)
    assert max(float((trained["taken"][k] - start[k]).abs().max()) for k in start) > 1e-4  # the weights did train


@pytest.mark.slow
def test_resume_with_a_round_in_flight_loses_and_repeats_no_prompt(tmp_path, tiny_model_path, monkeypatch):
    trained: list[list[list[int]]] = []
    take = Collector._next_round

    def recording(self, *args):
        data, batch, *rest = take(self, *args)
        trained[-1].append(data["prompts"].prompt_ids.tolist())
        sizes.append(batch.batch_size)
        return data, batch, *rest

    sizes: list[int] = []

    monkeypatch.setattr(Collector, "_next_round", recording)
    runs = {}
    # the straight run's step=2 checkpoint is saved with round 2 in flight (a run that ends at step 2 never requests it)
    for name, resume in [("straight", None), ("resumed", "straight")]:
        trained.append([])
        extra = [f"--ckpt_path={tmp_path / resume / 'checkpoints' / 'step=2.ckpt'}"] if resume else []
        # validation every 2 iterations samples 3 responses per prompt: it must wait for the round in flight, never
        # change the group size or temperature it samples with
        run_cli(
            "fit", cli_args(tmp_path / name, tiny_model_path, 4, *ASYNC, *KEEP, "--model.loop.val_samples=3", *extra)
        )
        runs[name] = trained[-1]
    assert len(runs["straight"]) == 4 and len(runs["resumed"]) == 2
    assert runs["straight"][:2] + runs["resumed"] == runs["straight"]  # same prompts, in order: none lost, none twice
    assert set(sizes) == {2 * 8}  # 2 prompts x group_size 8 in every round
    middle = torch.load(tmp_path / "straight" / "checkpoints" / "step=2.ckpt", weights_only=False)
    assert middle["PromptDataModule"]["position"]["batch"] == 2  # round 2 was in flight when it was saved


@pytest.mark.slow
@pytest.mark.server
def test_a_server_that_dies_with_a_round_in_flight_fails_the_iteration_clearly(tmp_path, tiny_model_path):
    from components.rollout.sglang.client import SGLangError
    from tests.fixtures.sglang_server import FakeSGLangServer

    server = FakeSGLangServer(tiny_model_path).start()
    server.die_after = 6  # two prompts per round: rounds 0-2 answered, round 3 finds the server gone
    sglang = ["--config", str(REPO / "configs/rollout/sglang.yaml"), f"--model.rollout.init_args.servers.urls=[{server.url}]",
              "--model.rollout.init_args.servers.backoff=0.01", "--model.rollout.init_args.servers.max_retries=1", "--trainer.limit_val_batches=0", *DENSE_REWARD]  # fmt: skip
    start = time.monotonic()
    try:
        with pytest.raises(SGLangError, match=server.url):
            run_cli(
                "fit",
                cli_args(tmp_path, tiny_model_path, 6, *sglang, "--config", str(REPO / "configs/loop/async.yaml")),
            )
    finally:
        server.stop()
    assert time.monotonic() - start < 120
    # round 3's requests kill it during iteration 2: whichever fails first, round 3 or the weight push after
    # iteration 2, last.ckpt holds completed iterations only and resumes at the first prompts they did not train
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] in (2, 3)
    assert last["PromptDataModule"]["position"]["batch"] == last["global_step"]


@pytest.mark.slow
@pytest.mark.server
def test_staleness_one_on_the_sglang_server(tmp_path, tiny_model_path):
    from tests.fixtures.sglang_server import FakeSGLangServer

    server = FakeSGLangServer(tiny_model_path).start()
    sglang = [
        "--config",
        str(REPO / "configs/rollout/sglang.yaml"),
        f"--model.rollout.init_args.servers.urls=[{server.url}]",
        *DENSE_REWARD,
    ]
    try:
        cli = run_cli(
            "fit", cli_args(tmp_path, tiny_model_path, 4, *sglang, "--config", str(REPO / "configs/loop/async.yaml"))
        )
    finally:
        server.stop()
    updates = cli.model.loop_state.optimizer_steps["policy"]
    assert (
        cli.trainer.global_step == 4 and updates == 4 and server.weight_version == "5"
    )  # a first push, then one per update
    logged = scalars(tmp_path)
    assert [v for _, v in logged["async/staleness_max"]] == [0.0, 1.0, 1.0, 1.0]
    # a separate flush is refused while requests run: only the push before training (validation's) sends one; the
    # later updates flush the cache themselves
    assert server.calls.count("/flush_cache") == 1


@pytest.mark.slow
@pytest.mark.server
def test_agent_episodes_are_sampled_ahead_on_the_server(tmp_path):
    """Multi-turn episodes on the background thread: each turn may come from another version; the bound holds."""
    from tests.fixtures.sglang_server import FakeSGLangServer

    tiny_calc = str(REPO / "lightning_rl/assets/tiny-calc")
    server = FakeSGLangServer(tiny_calc).start()
    args = ["--config", str(REPO / "configs/agent_calc.yaml"), "--config", str(REPO / "configs/rollout/sglang.yaml"),
            "--config", str(REPO / "configs/loop/async.yaml"), f"--model.rollout.init_args.servers.urls=[{server.url}]",
            "--model.policy.path", tiny_calc, "--data.batch_size", "4", "--data.val_size", "8", "--trainer.max_steps", "3",
            "--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.save_dir", str(tmp_path),
            "--trainer.logger.init_args.name", "run", "--trainer.callbacks.init_args.dirpath", str(tmp_path / "ckpt"),
            "--trainer.enable_progress_bar", "false"]  # fmt: skip
    try:
        cli = run_cli("fit", args)
    finally:
        server.stop()
    assert cli.trainer.global_step == 3
    logged = scalars(tmp_path)
    assert [v for _, v in logged["async/staleness_max"]] == [0.0, 1.0, 1.0]
    assert logged["agent/turns_mean"] and all(v == 0.0 for _, v in logged["async/dropped_frac"])


def test_validation_waits_for_the_round_in_flight():
    """`drain` (called when validation starts) returns only once no round is sampling: validation then seeds torch's
    random stream for its own samples without a round drawing from it meanwhile."""
    import threading
    from types import SimpleNamespace

    from lightning_rl.loop.ahead import RolloutAhead

    gate, finished = threading.Event(), []
    batch = RolloutBatch(
        response_ids=torch.ones(1, 1, dtype=torch.long), response_mask=torch.ones(1, 1, dtype=torch.long)
    )

    def produce(prompts, policy):
        if prompts > 0:
            gate.wait(10)
        finished.append(prompts)
        return batch, {}

    counter = iter(range(10))
    ahead = RolloutAhead(SimpleNamespace(samples_in_process=True, weight_version=0), produce, depth=1)
    data, *_ = ahead.take(lambda: {"prompts": next(counter)}, torch.nn.Linear(1, 1))
    assert data["prompts"] == 0  # round 1 is now sampling, held at the gate
    drained = threading.Thread(target=ahead.drain)
    drained.start()
    drained.join(0.3)
    assert drained.is_alive() and finished == [0]
    gate.set()
    drained.join(10)
    assert not drained.is_alive() and finished == [0, 1]
    ahead.close()


def test_closing_interrupts_the_round_sampling_and_starts_no_queued_one():
    """A run interrupted while a take waits for round 0 (an agent's episodes stuck in a tool, round 1 queued behind it):
    `close` cancels round 1 before it interrupts round 0, so round 1 never starts (before, the interrupt came first
    and round 1 could start in between, then ran whole, its tools timing out call by call). Round 0 tells the agent
    what it samples only after a while, so the first interrupts miss it: close keeps interrupting until it ends."""
    import threading
    import time
    from types import SimpleNamespace

    from lightning_rl.loop.ahead import RolloutAhead

    batch = RolloutBatch(
        response_ids=torch.ones(1, 1, dtype=torch.long), response_mask=torch.ones(1, 1, dtype=torch.long)
    )
    registered, cancelled, started, interrupts = threading.Event(), threading.Event(), [], []

    def produce(prompts, policy):
        started.append(prompts)
        if prompts == 0:
            time.sleep(0.5)  # the first turn: the agent does not know this round yet
            registered.set()
            cancelled.wait(30)  # a tool that never returns, until cancelled
        return batch, {}

    def interrupt():  # an agent's cancel: ends the rounds it knows, and takes a while (it kills tool processes)
        interrupts.append(time.monotonic())
        if registered.is_set():
            cancelled.set()
        time.sleep(0.1)

    counter = iter(range(10))
    ahead = RolloutAhead(SimpleNamespace(samples_in_process=True, weight_version=0), produce, depth=1)
    taking = threading.Thread(target=ahead.take, args=(lambda: {"prompts": next(counter)}, torch.nn.Linear(1, 1)))
    taking.start()
    while not started:
        time.sleep(0.01)
    start = time.monotonic()
    ahead.close(interrupt=interrupt)
    taking.join(5)
    assert time.monotonic() - start < 5 and not taking.is_alive()
    assert started == [0] and len(interrupts) >= 2  # round 1 never sampled; round 0 ended by a later interrupt


def test_a_sigterm_ends_the_wait_for_a_stuck_round_and_for_the_samplers_weights():
    """A round stuck in a tool call holds the in-process sampler's weights: once the run is told to stop, the trainer's
    wait for that round (take) and for the weights (push) each end within a poll with Lightning's SIGTERMException,
    not when the stuck call returns (the tool's timeout)."""
    import threading
    from types import SimpleNamespace

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from lightning_rl.loop.ahead import RolloutAhead

    batch = RolloutBatch(
        response_ids=torch.ones(1, 1, dtype=torch.long), response_mask=torch.ones(1, 1, dtype=torch.long)
    )
    stuck, released, stopped = threading.Event(), threading.Event(), threading.Event()

    def produce(prompts, policy):
        if prompts > 0:
            stuck.set()
            released.wait(30)  # a tool that never returns until the test ends
        return batch, {}

    counter = iter(range(10))
    rollout = SimpleNamespace(samples_in_process=True, weight_version=0, sync_weights=lambda policy: None)
    ahead = RolloutAhead(rollout, produce, depth=1, stopped=stopped.is_set)
    policy = torch.nn.Linear(1, 1)
    try:
        ahead.take(lambda: {"prompts": next(counter)}, policy)  # round 0; round 1 starts and gets stuck
        assert stuck.wait(10)
        stopped.set()
        start = time.monotonic()
        with pytest.raises(SIGTERMException, match="sampler's weights"):
            ahead.push(policy)  # the stuck round holds the sampler's copy
        with pytest.raises(SIGTERMException, match="next round of samples"):
            ahead.take(lambda: {"prompts": next(counter)}, policy)
        assert time.monotonic() - start < 5  # two polls, not the stuck call
        stopped.clear()
        released.set()
        ahead.push(policy)  # the weights are free again once the round has returned
    finally:
        released.set()
        ahead.close()


def test_no_round_is_requested_past_the_last_iteration():
    """A bound deeper than the run (max_staleness 100, 3 iterations) requests the run's rounds, not 101: the final
    validation would wait for every round queued (issue 24: 130 s instead of 26 s)."""
    from types import SimpleNamespace

    from lightning_rl.loop.ahead import RolloutAhead

    batch = RolloutBatch(
        response_ids=torch.ones(1, 1, dtype=torch.long), response_mask=torch.ones(1, 1, dtype=torch.long)
    )
    requested = []

    def next_prompts():
        requested.append(len(requested))
        return {"prompts": requested[-1]}

    ahead = RolloutAhead(
        SimpleNamespace(samples_in_process=True, weight_version=0), lambda prompts, policy: (batch, {}), depth=100
    )
    policy = torch.nn.Linear(1, 1)
    taken = [ahead.take(next_prompts, policy, rounds_left=3 - step)[0]["prompts"] for step in range(3)]
    assert taken == [0, 1, 2] and requested == [0, 1, 2]
    # dynamic sampling may take a second round in an iteration: requested then, one at a time
    assert ahead.take(next_prompts, policy, rounds_left=1)[0]["prompts"] == 3 and requested == [0, 1, 2, 3]
    ahead.close()


@pytest.mark.slow
def test_a_bound_deeper_than_the_run_samples_only_the_runs_rounds(tmp_path, tiny_model_path, monkeypatch):
    from lightning_rl.loop.ahead import RolloutAhead

    requested = []
    produce = RolloutAhead._produce

    def counting(self, prompts, policy, push):
        requested.append(len(prompts))
        return produce(self, prompts, policy, push)

    monkeypatch.setattr(RolloutAhead, "_produce", counting)
    cli = run_cli(
        "fit",
        cli_args(
            tmp_path, tiny_model_path, 3, *ASYNC, "--model.loop.max_staleness=100", "--trainer.limit_val_batches=0"
        ),
    )
    assert cli.trainer.global_step == 3 and len(requested) == 3
