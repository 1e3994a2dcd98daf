"""`lightning-rl` / `python cli.py`: LightningCLI over `RLModule` and `PromptDataModule`, and one subcommand per job.

    lightning-rl fit                                   # the embedded default: GRPO on builtin:arithmetic
    lightning-rl distill                               # fit on configs/distill.yaml, a --config stacking on it
    lightning-rl sft --config configs/sft.yaml         # supervised fine-tuning (lightning_rl.recipes.sft)
    lightning-rl reward-model --config configs/reward_model.yaml   # a Bradley-Terry reward model
    lightning-rl fit --config configs/grpo.yaml --config configs/strategy/ddp.yaml
    lightning-rl fit --config configs/grpo.yaml --ckpt_path runs/grpo/latest/checkpoints/last.ckpt   # continues that run
    lightning-rl validate --config configs/grpo.yaml --ckpt_path runs/grpo/latest/checkpoints/last.ckpt
    lightning-rl fit --config configs/dapo.yaml --print_config
    lightning-rl export runs/grpo/latest/checkpoints/last.ckpt runs/grpo/hf   # Hugging Face folders (lightning_rl.export)
    lightning-rl fit --config configs/ppo_rlhf.yaml --dry_run   # the components, batch arithmetic, models, folders
    lightning-rl components                            # every component, with the first line of its formula
    lightning-rl serve --base_models lightning_rl/assets/tiny-arith   # the Tinker API (lightning_rl.service)

Configs stack left to right (later files and command-line flags override earlier ones; lists
are replaced, not merged). Interpolation resolves across stacked files and overrides when it is
relative to the node, e.g. in ``model.aggregator.init_args``:
``constant: ${...rollout.init_args.max_new_tokens}`` (``.`` = init_args, ``..`` = aggregator,
``...`` = model). Absolute keys (``${model.rollout...}``) do not resolve under a subcommand with
jsonargparse 4.53 (it looks them up under ``fit.``).

A mistake in the command line or the config is one line, ``error: <message>`` with a "did you mean" (a dotted path
that does not import: the closest one that does), and exit status 2; a setting found not to work at set-up
(lightning_rl.core.errors.ConfigError), a server that does not answer, a bad data row, a reward that raised on a row
or a missing file is one line and exit status 1 (the whole trace goes to the run's log file, run.log).
``LIGHTNING_RL_DEBUG=1`` shows the trace instead.
"""

from __future__ import annotations

import os
import re
import sys
from enum import Enum
from pathlib import Path
from typing import Callable


def _pin_our_components() -> None:
    """Import our ``components`` package from the folder that holds ``lightning_rl`` before anything else can: under
    ``python -m lightning_rl.cli`` the working folder is first on ``sys.path``, and a user project with its own
    ``components/`` folder would shadow ours."""
    if "components" in sys.modules:
        return
    root = str(Path(sys.modules[(__package__ or "lightning_rl").split(".")[0]].__file__).resolve().parents[1])
    sys.path.insert(0, root)
    try:
        import components  # noqa: F401
    finally:
        sys.path.remove(root)


_pin_our_components()

import torch  # noqa: E402
from jsonargparse import set_parsing_settings  # noqa: E402
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback  # noqa: E402

from lightning_rl.callbacks.record import RecordRollouts  # noqa: E402
from lightning_rl.cli.flat_keys import translate_argv, translate_config_text  # noqa: E402
from lightning_rl.cli.replay import add_arguments as add_replay_arguments  # noqa: E402
from lightning_rl.cli.suggest import hint, unimportable  # noqa: E402
from lightning_rl.console import quiet, results_table  # noqa: E402
from lightning_rl.core.models import PolicyHolder  # noqa: E402
from lightning_rl.data import PromptDataModule  # noqa: E402
from lightning_rl.loop.module import RLModule  # noqa: E402
from lightning_rl.run_setup import (  # noqa: E402
    DEFAULT_TRAINER_CONFIG,
    TOKENIZER_LINK,
    as_list,
    begin_run,
    ending_on_sigterm,
    progress_bar,
    with_run_plugins,
)
from lightning_rl.runs import claim_file, run_folder  # noqa: E402

SUBCOMMANDS = {
    "fit": "Train with RL: a preset (--config) or GRPO by default",
    "validate": "Score a checkpoint (--ckpt_path) on held-out data",
    "distill": "On-policy distillation: fit on configs/distill.yaml",
    "sft": "Supervised fine-tuning: the warm start of an RL run",
    "reward-model": "Train a Bradley-Terry reward model on preference pairs",
    "export": "Write a checkpoint as Hugging Face model folders",
    "components": "List every component a config can name",
    "replay": "Train from a run's recorded rollouts, with no engine",
    "rollouts": "Show a rollout record: lightning-rl rollouts show DIR",
    "serve": "Serve the Tinker API to the tinker SDK",
}
"""`lightning-rl --help`: each subcommand in one line of an 80-column terminal."""
DESCRIPTIONS = {
    "distill": "fit with configs/distill.yaml as the base config: --config files and flags stack on it "
    "(lightning-rl distill --config configs/teacher/vllm.yaml); lightning-rl distill --help lists every option",
    "sft": "lightning-rl sft [fit|validate] --config configs/sft.yaml ... (fit when neither is given); "
    "lightning-rl sft --help lists every option",
    "reward-model": "lightning-rl reward-model [fit|validate] --config configs/reward_model.yaml ... (fit when neither "
    "is given); lightning-rl reward-model --help lists every option",
    "export": "lightning-rl export CKPT OUT_DIR [--adapter_only] (see lightning-rl export --help)",
    "components": "Every component a config can name, by kind, with the first line of its formula",
    "rollouts": "lightning-rl rollouts show DIR [--iteration N]: a record's iterations, or one iteration's samples "
    "(see lightning-rl rollouts --help)",
    "serve": "lightning-rl serve --base_models FOLDER [--api_keys tml-...] [--port N] [--sampler ...]: the Tinker API "
    "for the official tinker SDK (see lightning-rl serve --help)",
}
DRY_RUN_HELP = "Compose the run and print its components, batch arithmetic, models and folders; train nothing"
RECORD_HELP = (
    "Record every trained batch into the run's folder (rollouts/), for lightning-rl replay and lightning-rl rollouts "
    "show: true, or {keep_last: N} to keep the newest N iterations"
)
REPLAY_DESCRIPTION = (
    "fit from a rollout record instead of sampling: lightning-rl replay --rollouts runs/<name>/version_N/rollouts "
    "(--config defaults to the record's config.yaml; fit's options change the training)"
)
NEW_RUN_HELP = (
    "With --ckpt_path: start a new version folder from the checkpoint's weights instead of continuing the run "
    "the checkpoint belongs to (runs/<name>/version_N)"
)
DEBUG = "LIGHTNING_RL_DEBUG"


def debugging() -> bool:
    """``LIGHTNING_RL_DEBUG=1`` (or jsonargparse's ``JSONARGPARSE_DEBUG``): errors raise with their trace."""
    return any(
        os.environ.get(name, "").lower() not in ("", "0", "false", "no") for name in (DEBUG, "JSONARGPARSE_DEBUG")
    )


class RLArgumentParser(LightningArgumentParser):
    """LightningCLI's parser, whose errors are for people: ``error: <message>`` with a "did you mean" (lightning_rl.cli.suggest)
    and where to find every option, without the 100 lines of usage."""

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error or debugging():  # a nested parser's message: the parser that prints it rewrites it
            suggestion = hint(message, set(self._option_keys()))
            return super().error(f"{message} ({suggestion})" if suggestion else message, ex)
        # a dotted path that does not import: jsonargparse's message lists every type it tried; ours names the path
        suggestion = unimportable(message)
        if suggestion:
            message = suggestion
        elif suggestion := hint(message, set(self._option_keys())):
            message = f"{message} ({suggestion})"
        parser = getattr(ex, "subcommand_parser", None) or self
        message = " ".join(
            line.strip() for line in message.splitlines()
        )  # jsonargparse indents its causes over several lines
        sys.stderr.write(f"error: {message}\nevery option: {parser.prog.replace(' [options]', '')} --help\n")
        self.exit(2)

    def parse_string(self, content: str, *rest, **kwargs):
        """Parse a config file's text (``--config``), a server rollout's (teacher's) flat keys of the last release
        nested first (lightning_rl.cli.flat_keys)."""
        return super().parse_string(translate_config_text(content), *rest, **kwargs)

    def _option_keys(self):
        for action in self._all_actions():
            yield from (o[2:] for o in action.option_strings if o.startswith("--"))

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
        stage = str(stage.value if isinstance(stage, Enum) else stage)  # Lightning passes its TrainerFn enum
        names = ["config.yaml", "resume_config.yaml"] if stage == "fit" else [f"{stage}_config.yaml"]
        path = claim_file(folder, names)
        self.parser.save(self.config, str(path), skip_none=False, overwrite=True, multifile=self.multifile)
        self.save_config(trainer, pl_module, stage)


class RunCLI(LightningCLI):
    """A LightningCLI over a module trained on `PromptDataModule`, with what `lightning-rl` gives: run folders chosen
    before anything is written (lightning_rl.runs; ``--new_run``), the config written once beside the run
    (`SaveConfigBeside`), the progress bar, atomic checkpoint files, the policy's tokenizer for the prompts, and one-line
    errors (`RLArgumentParser`). `lightning-rl` (`RLCLI`) and the supervised recipe (lightning_rl.recipes.sft) are it."""

    progress_unit = "RL iterations"
    """What the progress bar counts (a training step of the module)."""

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """`fit` and `validate` (`test` / `predict` have no RL meaning here; `export` is handled by ``entry``)."""
        return {
            "fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
            "validate": {"model", "dataloaders", "datamodule"},
        }

    def init_parser(self, **kwargs) -> LightningArgumentParser:
        kwargs.setdefault("allow_abbrev", False)  # --trainer.max_step must not silently mean --trainer.max_steps
        return super().init_parser(**kwargs)

    def _instantiate_trainer(self, config: dict, callbacks: list):
        # the RL progress bar (lightning_rl.callbacks.progress) unless the bar is off or the config brings its own
        configured = as_list(config.get("callbacks"))
        bar = progress_bar([*configured, *callbacks], config.get("enable_progress_bar", True), self.progress_unit)
        return super()._instantiate_trainer(config, [*callbacks, *bar])

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs) -> LightningArgumentParser:
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        if subcommand == "fit":
            parser.add_argument("--new_run", action="store_true", help=NEW_RUN_HELP)
        return parser

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except Exception as err:  # a component, the data module or the Trainer refused its arguments: a config error
            if debugging():
                raise
            parser = self._subcommand_parsers.get(
                self.subcommand, self.parser
            )  # its prog names the subcommand's --help
            parser.error(config_error(err, self.config.get(self.subcommand) if self.subcommand else self.config))

    def _run_subcommand(self, subcommand: str) -> None:
        # the run's folder, before Lightning creates anything (lightning_rl.run_setup): `latest` in --ckpt_path is
        # resolved first, a run's own checkpoint continues that run, and a new version folder is claimed atomically
        config = self.config_init[subcommand]
        config["ckpt_path"] = begin_run(
            self.trainer,
            subcommand,
            config.get("ckpt_path"),
            new_run=bool(config.get("new_run")),
            policy_path=self.model.policy_spec.path if isinstance(self.model, PolicyHolder) else None,
        )
        ending_on_sigterm(self.trainer, lambda: super(RunCLI, self)._run_subcommand(subcommand))

    def validate(self, verbose: bool = True, **kwargs) -> list[dict]:
        """``Trainer.validate``, its results table with rounded numbers (Lightning prints 0.3100000023841858)."""
        results = self.trainer.validate(verbose=False, **kwargs)
        if verbose and self.trainer.is_global_zero and results:
            from rich import get_console

            get_console().print(results_table(results))
        return results

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments(*TOKENIZER_LINK)  # the prompts are tokenised with the policy's tokenizer

    def instantiate_trainer(self, **kwargs):
        accelerator = str(self._get(self.config_init, "trainer", default={}).get("accelerator", "auto"))
        if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
            build = (
                "a CPU-only build"
                if torch.version.cuda is None
                else f"a CUDA {torch.version.cuda} build that sees no GPU"
            )
            raise SystemExit(
                f"trainer.accelerator={accelerator} but torch {torch.__version__} is {build}. Install the CUDA build, e.g. "
                'make TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" install, or use --trainer.accelerator cpu'
            )
        # checkpoint files are written atomically unless the config brings its own CheckpointIO (lightning_rl.checkpoint)
        plugins = with_run_plugins(self._get(self.config_init, "trainer", default={}).get("plugins"))
        return super().instantiate_trainer(**{"plugins": plugins, **kwargs})


class RLCLI(RunCLI):
    """`lightning-rl`: `RunCLI` over `RLModule`, with ``--dry_run``, ``--record_rollouts``, the `replay` subcommand
    (fit from a rollout record: lightning_rl.cli.replay) and the `export`, `components` and `rollouts` subcommands."""

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs) -> None:
        super()._add_subcommands(parser, **kwargs)
        subcommands = parser._subcommands_action
        for choice in subcommands._choices_actions:  # Lightning's help is the Trainer method's ("Runs the full ...")
            choice.help = SUBCOMMANDS[choice.dest]
        # `replay` is fit's parser (a recorded run's config.yaml parses) with --rollouts; run by `_run_subcommand`
        trainer_class = self.trainer_class
        replay = self._prepare_subcommand_parser(
            trainer_class, "fit", **{**kwargs.get("fit", {}), "description": REPLAY_DESCRIPTION}
        )
        add_replay_arguments(replay)
        self._subcommand_parsers["replay"] = replay
        self._subcommand_method_arguments["replay"] = self._subcommand_method_arguments["fit"]
        # listed in --help, each with a parser of its own; `entry` runs them (the recipes' and lightning_rl.cli's modules)
        for name in SUBCOMMANDS:
            if name == "replay":
                subcommands.add_subcommand(name, replay, help=SUBCOMMANDS[name])
            elif name in DESCRIPTIONS:
                subcommands.add_subcommand(
                    name, self.parser_class(description=DESCRIPTIONS[name]), help=SUBCOMMANDS[name]
                )

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs) -> LightningArgumentParser:
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        if subcommand == "fit":
            parser.add_argument("--dry_run", action="store_true", help=DRY_RUN_HELP)
            parser.add_argument("--record_rollouts", type=bool | RecordRollouts, default=False, help=RECORD_HELP)
        return parser

    def instantiate_trainer(self, **kwargs):
        if self.subcommand == "replay":
            from lightning_rl.cli.replay import trainer_settings

            kwargs = {**trainer_settings(self.config_init["replay"]), **kwargs}
        return super().instantiate_trainer(**kwargs)

    def _instantiate_trainer(self, config: dict, callbacks: list):
        recording = self._get(self.config_init, "record_rollouts", default=False) if self.subcommand == "fit" else False
        if recording is True:
            recording = RecordRollouts()
        return super()._instantiate_trainer(config, [*callbacks, *([recording] if recording else [])])

    def _run_subcommand(self, subcommand: str) -> None:
        if subcommand == "fit" and self.config_init[subcommand].get("dry_run"):
            from lightning_rl.cli.dry_run import describe

            print(describe(self))
            return
        if subcommand == "replay":
            from lightning_rl.cli.replay import replay

            dumped = self._subcommand_parsers["replay"].dump(self.config["replay"], skip_none=False)
            replay(self.model, self.trainer, self.config_init["replay"], dumped)
            return
        super()._run_subcommand(subcommand)


def build_cli(
    cli_class: type[RunCLI], model_class: type, prog: str, description: str, args: list[str] | None, run: bool, **kwargs
) -> RunCLI:
    """``cli_class`` over ``model_class`` and `PromptDataModule`, with the trainer defaults of default_trainer.yaml under
    every --config, and the console quieted (lightning_rl.console)."""
    # omegaconf+ resolves ${...} across stacked --config files and overrides (jsonargparse >= 4.47)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    asked = list(args if args is not None else sys.argv[1:])
    nested = null_settings_flags(translate_argv(asked))  # flat keys of the last release, nested
    if args is not None:
        args = nested
    elif nested != asked:
        sys.argv[1:] = nested  # LightningCLI reads sys.argv (given args beside it, it warns)
    # --help shows each loop / optimizer field's docstring: ~1 s of parsing sources, so only when help is asked for
    set_parsing_settings(
        docstring_parse_attribute_docstrings=any(a in ("-h", "--help") or a.endswith(".help") for a in asked)
    )
    quiet()  # the console shows what a researcher can act on (lightning_rl.console)
    return cli_class(
        model_class,
        PromptDataModule,
        parser_class=RLArgumentParser,
        parser_kwargs={
            "prog": prog,
            "description": f"{description} Errors are one line; {DEBUG}=1 shows their trace.",
            "parser_mode": "omegaconf+",
            **{
                cmd: {"parser_mode": "omegaconf+", "default_config_files": [DEFAULT_TRAINER_CONFIG]}
                for cmd in ("fit", "validate")
            },
        },
        save_config_callback=SaveConfigBeside,
        args=args,
        run=run,
        **kwargs,
    )


SETTINGS_FLAG = re.compile(r"(--model\.(?:rollout|teacher)\.(?:init_args\.)?(?:servers|weights|verify))\.(\w+)")
NULLS = ("null", "Null", "NULL", "~")


def null_settings_flags(args: list[str]) -> list[str]:
    """``--model.rollout.init_args.servers.launch=null`` as ``--model.rollout.init_args.servers={launch: null}``.
    jsonargparse 4.53 hands a command-line value of a settings object's field (a dataclass in a component's
    ``init_args``) on as text, where None becomes "None": an error for a ``dict | None`` field, the folder "None" for a
    ``str | None`` one. The group's mapping form sets the same field, the group's others kept."""
    out, i = [], 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        match = SETTINGS_FLAG.fullmatch(name)
        given = 1 if eq else 2
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        if match and value.strip() in NULLS:
            out.append(f"{match[1]}={{{match[2]}: null}}")
            i += given
        else:
            out.append(args[i])
            i += 1
    return out


def main(args: list[str] | None = None, run: bool = True) -> RLCLI:
    return build_cli(
        RLCLI,
        RLModule,
        "lightning-rl",
        "Reinforcement learning for language models on PyTorch Lightning; `lightning-rl fit --help` lists every option.",
        args,
        run,
        auto_configure_optimizers=False,  # the policy's optimizer is model.optimizer; a bare --optimizer would optimize nothing
    )


def config_error(err: Exception, config) -> str:
    """One line for an exception raised while the config was being built: the innermost message (ours names the key
    and the fix), prefixed with the config key of the component that raised it when jsonargparse's wrapper names one."""
    chain = [err]
    while chain[-1].__cause__ is not None or (chain[-1].__context__ is not None and not chain[-1].__suppress_context__):
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    message = str(chain[-1]).strip() or type(chain[-1]).__name__
    # the wrapper nearest the cause names the component that raised first ("Given value: Namespace(class_path='...'")
    named = [m.group(1) for e in reversed(chain[:-1]) if (m := re.search(r"class_path[ =]'([\w.]+)'", str(e)))]
    key = _key_of(config, named[0]) if named and config is not None else None
    return f"{key}: {message}" if key and not message.startswith(key) else message


def _key_of(config, class_path: str, prefix: str = "") -> str | None:
    """The dotted key under which ``config`` names ``class_path`` (``model.kl`` for components.kl.KLRegularizer)."""
    config = config.as_dict() if hasattr(config, "as_dict") else config
    for name, value in config.items() if isinstance(config, dict) else []:
        if isinstance(value, dict) and value.get("class_path") == class_path:
            return f"{prefix}{name}"
        found = _key_of(value, class_path, f"{prefix}{name}.")
        if found:
            return found
    return None


def _said_in_one_line() -> tuple[type[BaseException], ...]:
    """Errors whose message names the culprit and the fix: the trace would only hide it."""
    from components.rollout.server.http import ServerError  # SGLang's and vLLM's
    from lightning_rl.core.errors import ConfigError, NonFiniteTrainingError, RewardError
    from lightning_rl.data.checks import DataError
    from lightning_rl.digests import CheckpointError

    return (
        ServerError,
        ConfigError,
        DataError,
        NonFiniteTrainingError,
        RewardError,
        FileNotFoundError,
        CheckpointError,
    )


def command_line(command: Callable[[], object]) -> None:
    """Run ``command`` as a command line: dotted paths in configs (my_project.rewards.fn) import from the working
    folder, after our own packages; the console is quieted; an error that names its culprit and the fix is one line,
    exit status 1. Returns nothing, so the exit status is 0 on success."""
    here = os.getcwd()
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here] + [here]
    quiet()
    try:
        command()
    except _said_in_one_line() as err:
        if debugging():
            raise
        sys.stderr.write(f"error: {err}\n")
        raise SystemExit(1) from None
