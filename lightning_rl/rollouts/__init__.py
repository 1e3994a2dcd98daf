"""Rollout records: every batch a run trained, as it was trained, one Parquet file per RL iteration, readable without
the run and trainable again without an engine (``lightning-rl replay``).

    import lightning_rl.rollouts
    batches = lightning_rl.rollouts.load("runs/grpo/version_0/rollouts")        # list[RolloutBatch], in iteration order
    record = lightning_rl.rollouts.Record("runs/grpo/version_0/rollouts")
    it = record.read(42)          # RecordedIteration: .batch, .version, .staleness, .collected, .random, .metrics

A run records with ``record_rollouts: true`` (lightning_rl.callbacks.RecordRollouts); the layout of the folder is in
lightning_rl.rollouts.record, that of a file in lightning_rl.rollouts.iteration and lightning_rl.rollouts.columns.
"""

from lightning_rl.rollouts.iteration import FORMAT_VERSION, RecordedIteration, read_iteration, weights_checksum
from lightning_rl.rollouts.record import Record, load
from lightning_rl.rollouts.writer import RolloutWriter

__all__ = [
    "FORMAT_VERSION",
    "Record",
    "RecordedIteration",
    "RolloutWriter",
    "load",
    "read_iteration",
    "weights_checksum",
]
