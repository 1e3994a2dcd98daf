"""The crafted-checkpoint scenario run by its own test (tests/lightning_rl/test_export.py) and the fault matrix
(tests/test_fault_matrix.py)."""

from __future__ import annotations

import pytest
import torch

from lightning_rl.export import export_checkpoint


class Payload:
    """Unpickling this runs code (here: creates a file), as a crafted checkpoint would."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def check_a_crafted_checkpoint_is_refused_without_running_its_code(tmp_path):
    marker = tmp_path / "pwned"
    torch.save(
        {"state_dict": {"policy.w": torch.ones(2)}, "hf_export": {}, "payload": Payload(marker)}, tmp_path / "evil.ckpt"
    )
    with pytest.raises(ValueError, match="evil.ckpt.*not plain data.*could run code"):
        export_checkpoint(tmp_path / "evil.ckpt", tmp_path / "out")
    assert not marker.exists() and not (tmp_path / "out").exists()
