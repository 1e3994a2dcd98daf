"""`lightning-rl components`: every component a config can name, by kind, with the first line of its docstring."""

from __future__ import annotations

import importlib
import inspect

KINDS = {
    "rollout": ("Rollout", "components.rollout"),
    "reward": ("Reward", "components.reward"),
    "advantage": ("AdvantageEstimator", "components.advantage"),
    "surrogate": ("Surrogate", "components.surrogate"),
    "aggregator": ("Aggregator", "components.aggregator"),
    "kl": ("KLPenalty", "components.kl"),
    "critic": ("Critic", "components.critic"),
    "teacher": ("Teacher", "components.teacher"),
    "sampling": ("GroupFilter", "components.dynamic_sampling"),
    "loss_terms": ("LossTerm", "components.loss_terms", "components.distill", "components.load_balance"),
    "ptx": ("PretrainLoss", "components.ptx"),
    "agent": ("Agent", "components.rollout"),
    "agent.init_args.env": ("Environment", "components.env"),
    "agent.init_args.env.init_args.tools": ("components.env.Tool", "components.env"),
}
"""model.<key> -> (its contract: a name in lightning_rl.core.contracts, or a dotted path; the modules whose concrete
subclasses of it are listed)."""


def catalog() -> dict[str, list[tuple[str, str]]]:
    """{model key: [(class_path, first docstring line)]}, concrete classes only."""
    out = {}
    for key, (contract, *modules) in KINDS.items():
        where, _, name = contract.rpartition(".")
        base = getattr(importlib.import_module(where or "lightning_rl.core.contracts"), name)
        seen = {}
        for name_of_module in modules:
            module = importlib.import_module(name_of_module)
            for name in getattr(module, "__all__", dir(module)):
                obj = getattr(module, name, None)
                if inspect.isclass(obj) and issubclass(obj, base) and not inspect.isabstract(obj):
                    doc = inspect.getdoc(obj) or ""
                    seen[f"{name_of_module}.{obj.__name__}"] = doc.split("\n\n")[0].replace("\n", " ")
        out[key] = sorted(seen.items())
    return out


def main() -> None:
    for key, entries in catalog().items():
        print(f"model.{key}:")
        for class_path, line in entries:
            print(f"  {class_path:45s} {line}")
