"""`lightning-rl components`: every component a config can name, by kind, with the first line of its docstring."""

from __future__ import annotations

import importlib
import inspect

KINDS = {
    "rollout": ("components.rollout", "Rollout"),
    "reward": ("components.reward", "Reward"),
    "advantage": ("components.advantage", "AdvantageEstimator"),
    "surrogate": ("components.surrogate", "Surrogate"),
    "aggregator": ("components.aggregator", "Aggregator"),
    "kl": ("components.kl", "KLRegularizer"),
    "critic": ("components.critic", "ValueCritic"),
    "teacher": ("components.teacher", "Teacher"),
    "sampling": ("components.dynamic_sampling", "DynamicSampling"),
    "loss_terms": ("components.loss_terms", "LossTerm", "components.distill", "components.load_balance"),
    "ptx": ("components.ptx", "PretrainMix"),
    "agent": ("components.rollout", "Agent"),
    "agent.init_args.env": ("components.env", "Environment"),
    "agent.init_args.env.init_args.tools": ("components.env", "Tool"),
}
"""model.<key> -> (module, the contract's class, more modules): the concrete subclasses of the contract that the modules
hold are listed."""


def catalog() -> dict[str, list[tuple[str, str]]]:
    """{model key: [(class_path, first docstring line)]}, concrete classes only."""
    out = {}
    for key, (module_name, base_name, *more) in KINDS.items():
        base = getattr(importlib.import_module(module_name), base_name)
        seen = {}
        for name_of_module in (module_name, *more):
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
