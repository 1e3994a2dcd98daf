"""A Hugging Face export at the end of ``fit`` (checkpoint files themselves: `lightning_rl.checkpoint`).

trainer:
  callbacks:
    - class_path: lightning_rl.callbacks.HFExport
      init_args: {dirpath: runs/grpo/hf}
"""

from __future__ import annotations

from typing import Literal

from lightning import Callback

from lightning_rl.checkpoint import export_info
from lightning_rl.core.models import DTYPES
from lightning_rl.distributed import trainable_state_dict
from lightning_rl.export import export_state


class HFExport(Callback):
    """At the end of ``fit``, write the policy (and critic) with ``save_pretrained`` (see ``lightning_rl.cli.export``)."""

    def __init__(self, dirpath: str = "runs/hf", dtype: Literal["float32", "bfloat16", "float16"] | None = None):
        """
        Args:
            dirpath: folder for ``policy/`` (and ``critic/``), each loadable with ``from_pretrained``.
            dtype: cast the weights on export (None = as trained).
        """
        self.dirpath, self.dtype = dirpath, dtype

    def on_fit_end(self, trainer, pl_module) -> None:
        state = trainable_state_dict(trainer, pl_module)  # collective under FSDP2 / ZeRO-3: every rank calls it
        if trainer.is_global_zero:
            export_state(state, export_info(pl_module), self.dirpath, DTYPES[self.dtype] if self.dtype else None)
        trainer.strategy.barrier("lightning_rl_hf_export")
