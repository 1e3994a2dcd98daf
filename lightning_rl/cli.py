"""`lightning-rl` / `python cli.py`: LightningCLI over `RLModule` and `PromptDataModule`.

    lightning-rl fit                                   # the embedded default: GRPO on builtin:arithmetic
    lightning-rl fit --config configs/grpo.yaml --config configs/strategy/ddp.yaml
    lightning-rl fit --config configs/grpo.yaml --ckpt_path runs/grpo/latest/checkpoints/last.ckpt   # continues that run
    lightning-rl validate --config configs/grpo.yaml --ckpt_path runs/grpo/latest/checkpoints/last.ckpt
    lightning-rl fit --config configs/dapo.yaml --print_config
    lightning-rl export runs/grpo/latest/checkpoints/last.ckpt runs/grpo/hf   # Hugging Face folders (lightning_rl.export)
    lightning-rl fit --config configs/ppo_rlhf.yaml --dry_run   # the components, batch arithmetic, models, folders
    lightning-rl components                            # every component, with the first line of its formula

Configs stack left to right (later files and command-line flags override earlier ones; lists
are replaced, not merged). Interpolation resolves across stacked files and overrides when it is
relative to the node, e.g. in ``model.aggregator.init_args``:
``constant: ${...rollout.init_args.max_new_tokens}`` (``.`` = init_args, ``..`` = aggregator,
``...`` = model). Absolute keys (``${model.rollout...}``) do not resolve under a subcommand with
jsonargparse 4.53 (it looks them up under ``fit.``).
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import sys
import warnings
from pathlib import Path

import torch
from jsonargparse import set_parsing_settings
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.callbacks.progress import ProgressBar
from lightning.pytorch.plugins.io import CheckpointIO

from .callbacks import AtomicCheckpointIO
from .data import PromptDataModule
from .module import RLModule
from .progress import RLProgressBar
from .runs import claim_file, resolve_checkpoint, run_folder, start_run

DEFAULT_TRAINER_CONFIG = str(Path(__file__).with_name("default_trainer.yaml"))
COMPONENTS_HELP = "List every component a config can name, by kind, with the first line of its formula"
EXPORT_HELP = "Write a checkpoint as Hugging Face model folders: lightning-rl export CKPT OUT_DIR [--adapter_only] (see lightning-rl export --help)"
DRY_RUN_HELP = "Compose the run and print its components, batch arithmetic, models and folders; train nothing"
NEW_RUN_HELP = ("With --ckpt_path: start a new version folder from the checkpoint's weights instead of continuing the run "
                "the checkpoint belongs to (runs/<name>/version_N)")


# Lightning warnings that are expected here, each for a reason:
QUIET = (
    ".*Found `dataloader_iter` argument.*",  # training_step pulls prompts itself (dynamic sampling needs more than one batch)
    ".*You are using the `dataloader_iter` step flavor.*",
    ".*module\\(s\\) in eval mode.*",  # frozen reference / reward models stay in eval mode by design
    ".*ModelCheckpoint with manual optimization.*",  # we want the post-update weights in checkpoints
    ".*does not have many workers.*",  # prompts are tokenised up front; loading them is not a bottleneck
    ".*isinstance\\(treespec, LeafSpec\\).*",  # a deprecation inside Lightning itself
    ".*The dirpath has changed from.*",  # each run checkpoints into its own folder (lightning_rl.runs): a resumed or validated run's differs
)


class _DropNoise(logging.Filter):
    """Lightning's info lines a researcher cannot act on (a product tip, the seed echo)."""

    NOISE = ("💡 Tip:", "Seed set to", "`Trainer.fit` stopped: `max_steps=")  # the bar says it; a raw line under it breaks its redraw

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.NOISE)


# LightningCLI's own flags for Lightning's optimizer / scheduler, which optimize nothing here: where their settings live
ROUTED = {"--optimizer": "--model.optimizer", "--lr_scheduler": "--model.optimizer.schedule"}


class RLArgumentParser(LightningArgumentParser):
    """LightningCLI's parser with a suggestion for a mistyped option, after the error (the last line printed)."""

    def error(self, message: str, ex: Exception | None = None):
        unknown = re.search(r"unrecognized arguments: (.*)", message)
        if unknown:
            options = {o for action in self._all_actions() for o in action.option_strings if o.startswith("--")}
            hints = []
            for name in (arg.split("=", 1)[0] for arg in unknown.group(1).split() if arg.startswith("--")):
                close = [ROUTED[name]] if name in ROUTED else difflib.get_close_matches(name, sorted(options), n=1, cutoff=0.75)
                hints += [f"{name} -> did you mean {close[0]}?"] if close else []
            if hints:
                message = f"{message} ({'; '.join(hints)})"
        super().error(message, ex)

    def _all_actions(self):
        yield from self._actions
        if self._subcommands_action is not None:
            for sub in self._subcommands_action._name_parser_map.values():
                yield from sub._actions


class SaveConfigBeside(SaveConfigCallback):
    """The resolved config in the run's folder, written once per command and never over another file: ``config.yaml``
    by the fit that started the run, ``resume_config.yaml`` by a fit that continued it, ``validate_config.yaml`` by a
    validate that logged into it (``.2``, ``.3`` ... when taken). Nothing without a run folder (``--trainer.logger false``)."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.already_saved:
            return
        self.already_saved = True  # every rank: only global rank 0 writes, and no collective is needed
        folder = run_folder(trainer) if trainer.is_global_zero else None
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        stage = str(getattr(stage, "value", stage))  # Lightning passes its TrainerFn enum
        names = ["config.yaml", "resume_config.yaml"] if stage == "fit" else [f"{stage}_config.yaml"]
        path = claim_file(folder, names)
        self.parser.save(self.config, str(path), skip_none=False, overwrite=True, multifile=self.multifile)
        self.save_config(trainer, pl_module, stage)


class RLCLI(LightningCLI):
    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """`fit` and `validate` (`test` / `predict` have no RL meaning here; `export` is handled by ``entry``)."""
        return {"fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"}, "validate": {"model", "dataloaders", "datamodule"}}

    def init_parser(self, **kwargs) -> LightningArgumentParser:
        kwargs.setdefault("allow_abbrev", False)  # --trainer.max_step must not silently mean --trainer.max_steps
        return super().init_parser(**kwargs)

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs) -> None:
        super()._add_subcommands(parser, **kwargs)
        export = self.parser_class(description=EXPORT_HELP)  # listed in --help; `entry` runs it (lightning_rl.export)
        parser._subcommands_action.add_subcommand("export", export, help=EXPORT_HELP)
        parser._subcommands_action.add_subcommand("components", self.parser_class(description=COMPONENTS_HELP), help=COMPONENTS_HELP)

    def _instantiate_trainer(self, config: dict, callbacks: list):
        # the RL progress bar (lightning_rl.progress) unless the bar is off or the config brings its own
        configured = config.get("callbacks") or []
        configured = configured if isinstance(configured, list) else [configured]
        if config.get("enable_progress_bar", True) is not False and not any(isinstance(c, ProgressBar) for c in [*configured, *callbacks]):
            callbacks = [*callbacks, RLProgressBar()]
        return super()._instantiate_trainer(config, callbacks)

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs) -> LightningArgumentParser:
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        if subcommand == "fit":
            parser.add_argument("--dry_run", action="store_true", help=DRY_RUN_HELP)
            parser.add_argument("--new_run", action="store_true", help=NEW_RUN_HELP)
        return parser

    def _run_subcommand(self, subcommand: str) -> None:
        if subcommand == "fit" and self.config_init[subcommand].get("dry_run"):
            from .dry_run import describe

            print(describe(self))
            return
        # the run's folder, before Lightning creates anything (lightning_rl.runs): `latest` in --ckpt_path is resolved
        # first, a run's own checkpoint continues that run, and a new version folder is claimed atomically
        config = self.config_init[subcommand]
        config["ckpt_path"] = resolve_checkpoint(config.get("ckpt_path"))
        start_run(self.trainer, subcommand, config["ckpt_path"], new_run=bool(config.get("new_run")))
        super()._run_subcommand(subcommand)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # the prompts are tokenised with the policy's tokenizer
        parser.link_arguments("model.policy.path", "data.tokenizer")

    def instantiate_trainer(self, **kwargs):
        accelerator = str(self._get(self.config_init, "trainer", default={}).get("accelerator", "auto"))
        if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else f"a CUDA {torch.version.cuda} build that sees no GPU"
            raise SystemExit(
                f"trainer.accelerator={accelerator} but torch {torch.__version__} is {build}. Install the CUDA build, e.g. "
                'make TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" install, or use --trainer.accelerator cpu'
            )
        # checkpoint files are written atomically unless the config brings its own CheckpointIO (lightning_rl.callbacks)
        plugins = self._get(self.config_init, "trainer", default={}).get("plugins")
        plugins = list(plugins) if isinstance(plugins, list) else [] if plugins is None else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            plugins.append(AtomicCheckpointIO())
        return super().instantiate_trainer(**{"plugins": plugins, **kwargs})


def main(args: list[str] | None = None, run: bool = True) -> RLCLI:
    # omegaconf+ resolves ${...} across stacked --config files and overrides (jsonargparse >= 4.47)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # --help shows each loop / optimizer field's docstring: ~1 s of parsing sources, so only when help is asked for
    asked = args if args is not None else sys.argv[1:]
    set_parsing_settings(docstring_parse_attribute_docstrings=any(a in ("-h", "--help") or a.endswith(".help") for a in asked))
    for pattern in QUIET:
        warnings.filterwarnings("ignore", message=pattern)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.seed", "lightning.fabric.utilities.rank_zero"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in log.filters):
            log.addFilter(_DropNoise())
    return RLCLI(
        RLModule,
        PromptDataModule,
        parser_class=RLArgumentParser,
        auto_configure_optimizers=False,  # the policy's optimizer is model.optimizer; a bare --optimizer would optimize nothing
        parser_kwargs={
            "description": "Reinforcement learning for language models on PyTorch Lightning; `lightning-rl fit --help` lists every option.",
            "parser_mode": "omegaconf+",
            **{cmd: {"parser_mode": "omegaconf+", "default_config_files": [DEFAULT_TRAINER_CONFIG]} for cmd in ("fit", "validate")},
        },
        save_config_callback=SaveConfigBeside,
        args=args,
        run=run,
    )


def entry() -> None:
    """The ``lightning-rl`` console script (returns nothing, so the exit status is 0 on success)."""
    if os.getcwd() not in sys.path:  # dotted paths in configs (my_project.rewards.fn) import from the working folder, as with `python cli.py`
        sys.path.insert(0, os.getcwd())

    if sys.argv[1:2] == ["export"]:  # not a Trainer subcommand: checkpoint -> Hugging Face folders
        from .export import main as export

        export(sys.argv[2:])
        return
    if sys.argv[1:2] == ["components"]:  # every component a config can name, with its formula's first line
        from .catalog import main as components

        components()
        return
    main()


if __name__ == "__main__":
    entry()
