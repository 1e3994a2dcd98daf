"""What the console shows: the progress bar, the samples table, the validate results, our warnings and errors; not the
lines a researcher cannot act on. ``quiet()`` is called once by the CLI (``lightning-rl``, ``python cli.py``) before
anything is built."""

from __future__ import annotations

import logging
import warnings

# Warnings that are expected here, each for a reason:
QUIET = (
    ".*Found `dataloader_iter` argument.*",  # training_step pulls prompts itself (dynamic sampling needs more than one batch)
    ".*You are using the `dataloader_iter` step flavor.*",
    ".*module\\(s\\) in eval mode.*",  # frozen reference / reward models stay in eval mode by design
    ".*ModelCheckpoint with manual optimization.*",  # we want the post-update weights in checkpoints
    ".*does not have many workers.*",  # prompts are tokenised up front; loading them is not a bottleneck
    ".*isinstance\\(treespec, LeafSpec\\).*",  # a deprecation inside Lightning itself
    ".*The dirpath has changed from.*",  # each run checkpoints into its own folder (lightning_rl.runs): a resumed or validated run's differs
    ".*`is_gradient_checkpointing` is deprecated.*",
    ".*Total length of `list` across ranks is zero.*",  # data.val_data: null is how a run turns validation off  # transformers 5 to peft (LoRA runs, export): nothing for our user to change
)

# Lightning's info lines a researcher cannot act on
DROPPED_LINES = (
    "💡 Tip:",  # a product tip
    "Seed set to",  # the seed is in the run's config.yaml
    "`Trainer.fit` stopped: `max_steps=",  # the bar says it; a raw line under it breaks its redraw
    "GPU available:",  # the device line at every Trainer: the config names the accelerator, and a GPU left unused is warned about
    "TPU available:",
    "HPU available:",
)

# transformers' per-call bars: one per model load and one per save_pretrained (every SGLang weight push writes one)
DROPPED_BARS = ("Loading weights", "Writing model shards")


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(DROPPED_LINES)


def _bar_without_noise(previous):
    def hook(factory, args, kwargs):
        if kwargs.get("desc") in DROPPED_BARS:
            from transformers.utils.logging import EmptyTqdm

            return EmptyTqdm(*args, **kwargs)
        return previous(factory, args, kwargs) if previous is not None else factory(*args, **kwargs)

    hook.lightning_rl = True
    return hook


def quiet() -> None:
    """Filter the warnings in ``QUIET``, Lightning's lines in ``DROPPED_LINES`` and transformers' bars in ``DROPPED_BARS``
    (download bars stay: a model fetched from the hub shows its progress). Idempotent."""
    for pattern in QUIET:
        warnings.filterwarnings("ignore", message=pattern)
    for name in (
        "lightning.pytorch.utilities.rank_zero",
        "lightning.fabric.utilities.seed",
        "lightning.fabric.utilities.rank_zero",
    ):
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in log.filters):
            log.addFilter(_DropNoise())
    from transformers.utils import logging as hf_logging

    if hasattr(hf_logging, "set_tqdm_hook"):  # transformers >= 5; 4.x shows neither bar
        previous = hf_logging.set_tqdm_hook(None)
        hf_logging.set_tqdm_hook(previous if getattr(previous, "lightning_rl", False) else _bar_without_noise(previous))


def rounded(value: float) -> str:
    """A metric as a person reads it: at most 4 decimals without trailing zeros (0.3100000023841858 -> 0.31, a float32
    read back as a double), in scientific notation below 0.001 or from a million."""
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:.4f}".rstrip("0").rstrip(".")
    return f"{value:.3e}"


def results_table(results: list[dict], stage: str = "validate"):
    """The table ``Trainer.validate(verbose=True)`` prints, one column per dataloader, with every number `rounded`."""
    from rich.table import Table

    names = sorted({name.split("/dataloader_idx_")[0] for result in results for name in result})
    table = Table(f"{stage} metric".capitalize(), *(f"DataLoader {i}" for i in range(len(results))))
    for name in names:
        cells = []
        for result in results:
            value = next((v for k, v in result.items() if k.split("/dataloader_idx_")[0] == name), None)
            cells.append(" " if value is None else rounded(float(value)))
        table.add_row(name, *cells)
    return table
