"""Every Lightning callback lightning_rl gives, one file per concern. `RLModule` adds the first eight itself
(``configure_callbacks``); the progress bar comes with every run (lightning_rl.run_setup); `HFExport` is added in a
config (``trainer.callbacks``), `RecordRollouts` by ``record_rollouts: true``. The CLI's ``SaveConfigBeside`` is LightningCLI's config writer and stays in
lightning_rl.cli.

    fault.py           ResumableCheckpoints, FiniteCheckpoints, TeardownOnException: what a failure leaves behind
    run_folders.py     RunFolders: checkpoints in the run's folder, ``latest/`` linked to the newest run
    run_log.py         RunLog: the run's log file (run.log), with the whole trace of an error that stopped it
    summary.py         RunSummary: the run folder at the start of fit; at its end held-out before -> after, iterations,
                       time, the checkpoint, and a plot of the held-out score in TensorBoard
    context_length.py  ContextLengthCheck: prompt + response lengths against the policy's positions
    validation.py      ValidateBeforeAndAfter: a validation point before the first iteration and after the last
    progress.py        RLProgressBar (terminal), LineProgress (log file or pipe): RL iterations and their metrics
    export.py          HFExport: Hugging Face folders at the end of fit
    record.py          RecordRollouts: every trained batch in the run's folder (record_rollouts: true)
"""

from lightning_rl.callbacks.context_length import ContextLengthCheck
from lightning_rl.callbacks.export import HFExport
from lightning_rl.callbacks.fault import FiniteCheckpoints, ResumableCheckpoints, TeardownOnException
from lightning_rl.callbacks.progress import LineProgress, RLProgressBar
from lightning_rl.callbacks.record import RecordRollouts
from lightning_rl.callbacks.run_folders import RunFolders
from lightning_rl.callbacks.run_log import RunLog
from lightning_rl.callbacks.summary import RunSummary
from lightning_rl.callbacks.validation import ValidateBeforeAndAfter

__all__ = [
    "ContextLengthCheck",
    "FiniteCheckpoints",
    "HFExport",
    "LineProgress",
    "RLProgressBar",
    "RecordRollouts",
    "ResumableCheckpoints",
    "RunFolders",
    "RunLog",
    "RunSummary",
    "TeardownOnException",
    "ValidateBeforeAndAfter",
]
