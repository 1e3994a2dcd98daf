"""`RunLog`: the run's log file, ``<run folder>/run.log``: the command, the lines Lightning and lightning_rl say on the
console (run folder, servers started, resume lines, the summary), and the whole trace of an error that stops the run.

The console says an error that names its culprit and the fix (a reward that raised on a row, a bad setting) in one
line; its trace, which a bug report needs, is kept here. Written by global rank 0 only; nothing without a run folder
(``--trainer.logger false``).
"""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path

from lightning import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_rl.runs import run_folder, shown_path

LOGGER = "lightning.pytorch"
"""The logger of Lightning's console lines (``rank_zero_info``), ours included: every line it says is copied here."""


class RunLog(Callback):
    """Copies the console's lines into ``<run folder>/run.log`` from set-up to teardown, and the trace of an error."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self._handler: logging.FileHandler | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self._handler is not None or not trainer.is_global_zero:
            return
        folder = run_folder(trainer)
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "run.log"
        self._handler = logging.FileHandler(self.path, encoding="utf-8")
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
        logging.getLogger(LOGGER).addHandler(self._handler)
        command = " ".join([shown_path(Path(sys.argv[0])), *sys.argv[1:]])
        write_to_file(self._handler, f"{TrainerFn(stage).value}: {command}")  # Lightning passes TrainerFn.FITTING

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self._handler is None:
            return
        trace = "".join(traceback.format_exception(type(exception), exception, exception.__traceback__))
        write_to_file(self._handler, f"the run stopped on this error:\n{trace}")
        rank_zero_info(f"the whole trace: {shown_path(self.path)}")
        self._close()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._close()

    def _close(self) -> None:
        if self._handler is not None:
            logging.getLogger(LOGGER).removeHandler(self._handler)
            self._handler.close()
            self._handler = None


def write_to_file(handler: logging.FileHandler, message: str) -> None:
    """``message`` into the log file only (not the console)."""
    handler.emit(logging.LogRecord(LOGGER, logging.INFO, __file__, 0, message, None, None))
