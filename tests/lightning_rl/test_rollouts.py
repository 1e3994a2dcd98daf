"""Rollout records (lightning_rl.rollouts): a batch written and read back is the same batch bit for bit, whatever its
fields hold (a tensor field of any shape and dtype, including one added later; per-row data; images and per-row
tensors by content hash); the folder's reader, keep_last, the background writer, the format version and the checksum
of the weights."""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields

import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from torch import Tensor, nn

import lightning_rl.rollouts.iteration as iteration_format
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.rollouts import Record, RecordedIteration, RolloutWriter, load, read_iteration, weights_checksum
from lightning_rl.rollouts.columns import read_batch
from lightning_rl.rollouts.iteration import read_fields, write_iteration
from lightning_rl.rollouts.record import prune, start_session


def full_batch(seed: int = 0) -> RolloutBatch:
    """Every kind of field a batch holds: per-token and per-sample tensors of several dtypes, a (B, R, K) field, a
    zero-width one, per-row columns of text, numbers and anything else, a reward's parts, a prompt's images and their
    processed tensors shared by its group (and a text-only prompt's none)."""
    g = torch.Generator().manual_seed(seed)
    b, r = 4, 5
    image = Image.new("RGB", (6, 4), (10, 200, 30))
    inputs = {"pixel_values": torch.randn(3, 8, generator=g), "image_grid_thw": torch.tensor([[1, 2, 2]])}
    return RolloutBatch(
        response_ids=torch.randint(0, 50, (b, r), generator=g),
        response_mask=torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]]),
        prompt_ids=torch.randint(0, 50, (b, 3), generator=g),
        prompt_mask=torch.tensor([[0, 1, 1]] * b),
        rollout_logprobs=torch.randn(b, r, generator=g) * torch.tensor(-0.0),  # -0.0 keeps its sign bit
        truncated=torch.tensor([False, True, False, False]),
        group_ids=torch.tensor([0, 0, 1, 1]),
        scores=torch.tensor([1.0, float("nan"), -float("inf"), 0.25]),
        sample_mask=torch.ones(b),
        advantages=torch.randn(b, r, generator=g).bfloat16(),
        values=torch.randn(b, r, generator=g).half(),
        versions=torch.tensor([3, 3, 2, 2]),
        token_versions=torch.zeros(b, 0, dtype=torch.long),
        teacher_topk_ids=torch.randint(0, 9, (b, r, 2), generator=g),
        teacher_topk_logprobs=torch.randn(b, r, 2, generator=g, dtype=torch.float64),
        columns={
            "prompt": ["1+1=", "1+1=", "2+2=", "2+2="],
            "answer": [2, 2, 4, 4],
            "weight": [0.5, 0.5, 1.5, 1.5],
            "result": [None, {"calls": [1, 2]}, "text", 3],
        },
        score_parts={"accuracy": torch.tensor([1.0, 0.0, 1.0, 0.0]), "format": torch.tensor([0.5, 0.5, 0.0, 1.0])},
        images=[[image], [image], [], []],
        image_inputs=[inputs, inputs, None, None],
    )


def assert_same_batch(a: RolloutBatch, b: RolloutBatch) -> None:
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape, f.name
            assert torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)), f.name  # every bit
        elif f.name == "score_parts":
            assert list(x) == list(y) and all(torch.equal(x[k], y[k]) for k in x)
        elif f.name == "images":
            assert [[i.tobytes() for i in row] for row in x] == [[i.tobytes() for i in row] for row in y]
        elif f.name == "image_inputs":
            assert [None if e is None else {k: v.tolist() for k, v in e.items()} for e in x] == [
                None if e is None else {k: v.tolist() for k, v in e.items()} for e in y
            ]
        else:
            assert x == y, f.name


def recorded(iteration: int = 7, batch: RolloutBatch | None = None, **changes) -> RecordedIteration:
    batch = full_batch() if batch is None else batch
    record = RecordedIteration(
        iteration=iteration,
        batch=batch,
        collected=("response_ids", "response_mask", "prompt_ids", "prompt_mask", "scores", "columns"),
        version=4,
        random={"torch": torch.get_rng_state(), "shuffle": torch.Generator().manual_seed(3).get_state()},
        metrics={"sums": {"reward/mean": torch.tensor(0.75)}, "weights": {"reward/mean": torch.tensor(4.0)}},
        inputs={"ptx_ids": torch.arange(6).reshape(2, 3)},
        weights=torch.tensor([11, -2], dtype=torch.int64),
    )
    for name, value in changes.items():
        setattr(record, name, value)
    return record


def test_a_batch_read_back_is_the_batch_written_bit_for_bit(tmp_path):
    path = write_iteration(recorded(), tmp_path, "test")
    back = read_iteration(path)
    assert_same_batch(full_batch(), back.batch)
    assert (back.iteration, back.version, back.rank, back.world_size) == (7, 4, 0, 1)
    assert back.staleness.tolist() == [1, 1, 2, 2]  # version 4 trained samples of versions 3 and 2
    assert torch.equal(back.random["torch"], torch.get_rng_state()) and back.weights.tolist() == [11, -2]
    assert back.metrics == {"sums": {"reward/mean": torch.tensor(0.75)}, "weights": {"reward/mean": torch.tensor(4.0)}}
    assert back.inputs["ptx_ids"].tolist() == [[0, 1, 2], [3, 4, 5]]
    # a prompt's images and tensors are one entry for its group, as in the batch (and one file per content)
    assert back.batch.image_inputs[0] is back.batch.image_inputs[1] and back.batch.images[0] is back.batch.images[1]
    assert len(list((tmp_path / "images").iterdir())) == 1 and len(list((tmp_path / "tensors").iterdir())) == 1
    # the rollout's view leaves out what the trainer computed (advantages, values)
    rollout = back.rollout()
    assert rollout.advantages is None and rollout.values is None and rollout.scores is back.batch.scores


def test_a_tensor_field_added_later_is_a_column_like_the_others(tmp_path):
    """A field added to the batch later (here tokens x layers x top_k per sample, as routing replay's) travels without a
    change to the format."""

    @dataclass
    class LaterBatch(RolloutBatch):
        later_routes: Tensor | None = None  # (B, R, layers, top_k)

    routes = torch.randint(0, 8, (4, 5, 3, 2), dtype=torch.int16)
    batch = LaterBatch(**{f.name: getattr(full_batch(), f.name) for f in fields(RolloutBatch)}, later_routes=routes)
    path = write_iteration(recorded(batch=batch), tmp_path, "test")
    back = read_batch(pq.read_table(path), tmp_path, LaterBatch)
    assert back.later_routes.dtype == torch.int16 and torch.equal(back.later_routes, routes)
    assert_same_batch(full_batch(), RolloutBatch(**{f.name: getattr(back, f.name) for f in fields(RolloutBatch)}))


def test_the_file_is_plain_parquet_with_a_staleness_column(tmp_path):
    table = pq.read_table(write_iteration(recorded(), tmp_path, "test"))
    assert table.num_rows == 4
    assert table.column("staleness").to_pylist() == [1, 1, 2, 2]
    assert table.column("columns.prompt").to_pylist() == ["1+1=", "1+1=", "2+2=", "2+2="]
    assert table.column("response_ids").to_pylist()[0] == full_batch().response_ids[0].tolist()
    fields_read = read_fields(tmp_path / "iteration_000007.parquet", ["scores", "versions", "not_a_field"])
    assert list(fields_read) == ["scores", "versions"] and fields_read["versions"].tolist() == [3, 3, 2, 2]


def test_a_file_of_a_newer_format_is_refused_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(iteration_format, "FORMAT_VERSION", iteration_format.FORMAT_VERSION + 1)
    path = write_iteration(recorded(), tmp_path, "9.9")
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"format 2 \(lightning_rl 9.9\).*reads format 1 and older: upgrade"):
        read_iteration(path)


def test_a_record_reads_its_iterations_in_order_and_names_a_missing_one(tmp_path):
    for i in (3, 1, 2):
        write_iteration(recorded(i), tmp_path, "test")
    write_iteration(recorded(2, rank=1, world_size=2), tmp_path, "test")
    record = Record(tmp_path)
    assert record.iterations == [1, 2, 3] and record.world_size == 2 and len(record) == 3
    assert [it.iteration for it in record] == [1, 2, 3] and record.read(2, rank=1).rank == 1
    assert len(load(tmp_path)) == 3 and len(load(tmp_path / "iteration_000002.rank1.parquet")) == 1
    assert_same_batch(full_batch(), load(tmp_path)[0])
    prune(tmp_path, keep_last=2)
    assert Record(tmp_path).iterations == [2, 3] and (tmp_path / "iteration_000002.rank1.parquet").exists()
    with pytest.raises(
        FileNotFoundError, match=r"no iteration 1 \(it holds 2..3, 2 iterations, the oldest removed by keep_last"
    ):
        Record(tmp_path).read(1)
    with pytest.raises(FileNotFoundError, match="record_rollouts: true"):
        Record(tmp_path / "missing")


def test_a_resumed_fit_replaces_what_the_interrupted_one_recorded_after_its_checkpoint(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("model: {}\n")
    folder = tmp_path / "rollouts"
    start_session(folder, 0, 1, config)
    for i in (1, 2, 3):
        write_iteration(recorded(i), folder, "test")
    start_session(folder, 2, 1, config)  # resumed from the checkpoint of iteration 2: iteration 3 is trained again
    record = Record(folder)
    assert record.iterations == [1, 2] and record.config.read_text() == "model: {}\n"
    assert [s["from_iteration"] for s in record.manifest["sessions"]] == [1, 3]


def test_the_writer_writes_on_its_own_thread_keeps_the_last_n_and_raises_a_failure_on_the_loops(tmp_path, monkeypatch):
    threads = []
    write = iteration_format.write_iteration

    def spy(record, folder, version):
        threads.append(threading.current_thread().name)
        return write(record, folder, version)

    monkeypatch.setattr("lightning_rl.rollouts.writer.write_iteration", spy)
    writer = RolloutWriter(tmp_path / "rollouts", keep_last=2)
    for i in range(1, 6):
        writer.submit(recorded(i))
    writer.close()
    assert Record(tmp_path / "rollouts").iterations == [4, 5]
    assert len(threads) == 5 and all(name.startswith("rollout-record") for name in threads)

    broken = RolloutWriter(tmp_path / "broken")
    (tmp_path / "broken").rmdir()
    (tmp_path / "broken").write_text("a file where the folder was")
    broken.submit(recorded(1))
    with pytest.raises(RuntimeError, match=r"recording the rollouts of iteration 1 into .*broken failed"):
        broken.close()
    with pytest.raises(ValueError, match="keep_last=0 must be >= 1"):
        RolloutWriter(tmp_path / "x", keep_last=0)


def test_the_weights_checksum_is_exact_one_bit_changes_it_and_the_thread_count_does_not(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(300, 200), nn.Linear(200, 3)).requires_grad_(True)
    model[1].bias.requires_grad_(False)  # frozen: not in the checksum
    bits = [p.detach().view(torch.int32).to(torch.int64) for p in model.parameters() if p.requires_grad]
    expected = [((b.sum() + 2**31) % 2**32 - 2**31).item() for b in bits]  # the wrapped int32 sum, by hand in int64
    assert weights_checksum(model).tolist() == expected and len(expected) == 3
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert weights_checksum(model).tolist() == expected
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        flat = model[0].weight.view(-1).view(torch.int32)
        flat[1234] ^= 1  # the lowest bit of one weight
    assert weights_checksum(model).tolist() != expected


def test_a_folder_with_nothing_recorded_is_refused(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="holds no recorded iteration"):
        Record(tmp_path)
