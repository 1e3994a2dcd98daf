"""Check once, at construction, that every field a component reads will be produced.

A config that pairs GAE with no critic, or TIS with a rollout that reports no log-probs, fails
here with a message saying what to add, instead of failing (or silently degrading) mid-run.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from lightning_rl.core.errors import ConfigError, closest_name
from lightning_rl.core.forward_outputs import READABLE
from lightning_rl.core.models import context_length
from lightning_rl.core.truncation import Truncation
from lightning_rl.data.prompts import PromptDataModule

# always produced by the module itself
MODULE_FIELDS = frozenset({"scores", "sample_mask", "token_rewards", "advantages", "old_logprobs", "ref_logprobs"})

HOW_TO_PROVIDE = {
    "values": "add a critic: model.critic with class_path components.critic.ValueCritic",
    "returns": "use an estimator that produces value targets (components.advantage.GAE)",
    "rollout_logprobs": "use a rollout that reports sampler log-probs (components.rollout.SGLangRollout, or HFRollout with return_logprobs: true)",
    "is_greedy": "enable the greedy baseline on the rollout (greedy_baseline: true on HFRollout or SGLangRollout)",
    "teacher_logprobs": "add a teacher: model.teacher with class_path components.teacher.HFTeacher (or a server "
    "teacher: VLLMTeacher, SGLangTeacher, CompletionsTeacher)",
    "teacher_topk_ids": "add a teacher that returns its top k: model.teacher.init_args.top_k > 0",
    "teacher_topk_logprobs": "add a teacher that returns its top k: model.teacher.init_args.top_k > 0",
    "teacher_logits": "add a teacher in this process, which gives its whole distribution (components.teacher.HFTeacher)",
}


@dataclass(frozen=True)
class Needs:
    fields: frozenset[str]
    """Every RolloutBatch field some component reads."""
    before_optimize: frozenset[str]
    """Fields read by the score / estimate phases (so they must exist before the optimize phase)."""

    def __contains__(self, name: str) -> bool:
        return name in self.fields


def _requires(component) -> frozenset[str]:
    return frozenset(component.requires) if component is not None else frozenset()


def check_requirements(module) -> Needs:
    """Fields read by the components of ``module``; raises ValueError naming the first unmet one."""
    early = {"advantage": module.advantage, "reward": module.reward, "sampling": module.sampling}
    late = {
        "surrogate": module.surrogate,
        "critic": module.critic,
        **{f"loss_terms[{i}]": t for i, t in enumerate(module.loss_terms)},
    }
    for i, term in enumerate(module.loss_terms):
        unknown = sorted(set(term.reads) - READABLE)
        if unknown:
            raise ValueError(
                f"model.loss_terms[{i}] ({type(term).__name__}) reads {unknown} of the policy's forward, which gives "
                f"{sorted(READABLE)} (and the log-probs): fix its `reads`"
            )
    before = set().union(*(_requires(c) for c in early.values()))
    during = set().union(*(_requires(c) for c in late.values()))
    kl = module.kl
    if kl is not None:
        # the reward-side penalty and the controller read pi_old before the update
        (before if kl.placement == "reward" or kl.target is not None else during).update(_requires(kl))
        if kl.target is not None:
            before |= {"old_logprobs", "ref_logprobs"}
    provided = set(module.rollout.provides) | MODULE_FIELDS
    if module.critic is not None:
        provided.add("values")
    if module.advantage.produces_returns:
        provided.add("returns")
    if module.teacher is not None:
        provided |= module.teacher.provides
    for name, component in {**early, **late, "kl": kl}.items():
        missing = sorted(_requires(component) - provided)
        if missing:
            hints = "; ".join(
                f"{field}: {HOW_TO_PROVIDE.get(field, 'no configured component produces it')}" for field in missing
            )
            raise ValueError(
                f"model.{name} ({type(component).__name__}) needs {missing}, which nothing in this config produces. {hints}"
            )
    # None on a default built with jsonargparse's lazy_instance before its first method call (setup): its settings are
    # the defaults, which pass these checks
    params = module.rollout.params
    if params is not None and module.advantage.group_relative and params.group_size < 2:
        raise ValueError(
            f"model.advantage ({type(module.advantage).__name__}) compares each response with the others sampled for the same "
            f"prompt, but model.rollout.init_args.group_size={params.group_size}: every advantage would be 0 and nothing would train. "
            "Set group_size >= 2 (GRPO uses 8 to 64), or use an estimator without groups (ReinforceBaseline, ReMax, GAE)"
        )
    if (
        Truncation.of(params) is not None
        and "rollout_logprobs" in module.rollout.provides
        and not module.rollout.truncated_logprobs
    ):
        warnings.warn(
            f"model.rollout ({type(module.rollout).__name__}) samples with top_p/top_k and reports its log-probs before "
            "the truncation, while the trainer's are renormalised over the tokens it kept: rollout/logprob_diff_* and "
            "TIS/MIS read log(kept mass) as a sampler mismatch (use VLLMRollout or HFRollout, or top_p=1 and top_k=0)"
        )
    inert = module.surrogate.inert_on_policy
    if inert is not None and module.loop.ppo_epochs == 1 and module.loop.num_mini_batches == 1:
        warnings.warn(
            f"model.surrogate ({type(module.surrogate).__name__}): {inert} is exactly 0, and so is its gradient, on this "
            "on-policy update (model.loop.ppo_epochs 1 and num_mini_batches 1: pi_theta = pi_old when the loss is taken), so it "
            "has no effect; set model.loop.num_mini_batches (or ppo_epochs) > 1, as configs/grpo_klcov.yaml does"
        )
    if module.loop.max_staleness > 0 and "rollout_logprobs" not in _requires(module.surrogate):
        warnings.warn(
            f"model.loop.max_staleness={module.loop.max_staleness} trains on samples from older weights, but model.surrogate "
            f"({type(module.surrogate).__name__}) does not read the sampler's log-probs, so nothing corrects for their staleness: "
            "use components.surrogate.DecoupledClip (configs/loop/async.yaml), or give the surrogate a correction (TIS/MIS)"
        )
    return Needs(frozenset(before | during), frozenset(before))


def check_data_columns(module, data: PromptDataModule | None) -> None:
    """Fail before any model loads when a reward reads a dataset column (``data_columns()``) that a data source it
    scores does not deliver: the training reward against ``data.train_data``, the validation reward against each
    ``data.val_data``. A reward gets each column under its ``data.columns`` name: a column read by its own name but
    renamed by the mapping is named with the name it arrives under."""
    if data is None:  # a data module of the user's own: its columns are its business
        return
    hp = data.hparams
    scored = []  # (key, reward, source, columns)
    if data.train_rows is not None:
        scored.append(("model.reward", module.reward, hp.train_data, data.train_rows.column_names))
    if data.val_rows:
        key = "model.val_reward" if module.val_reward is not module.reward else "model.reward"
        sources = list(hp.val_data.values()) if isinstance(hp.val_data, dict) else [hp.val_data]
        scored += [(key, module.val_reward, s, rows.column_names) for s, rows in zip(sources, data.val_rows)]
    renamed = {theirs: ours for ours, theirs in (hp.get("columns") or {}).items() if theirs != ours}
    for key, reward, source, have in scored:
        have = [c for c in have if c != "input_ids"]
        for name in sorted(reward.data_columns() - set(have)):
            if name in renamed:
                arrives = renamed[name]
                raise ConfigError(
                    f"{key} ({reward.name}) reads the column {name!r}, which reaches a reward as {arrives!r}: "
                    f"data.columns maps {{{arrives}: {name}}}, and a reward gets each column under its data.columns "
                    f"name. Read {arrives!r} instead (a reward function: name its parameter {arrives}), or keep the "
                    f"column's own name with data.columns: {{{name}: {name}}} in place of {{{arrives}: {name}}}"
                )
            close = closest_name(name, have)
            raise ConfigError(
                f"{key} ({reward.name}) reads the column {name!r}, which {source} does not have"
                f"{f' (did you mean {close!r}?)' if close else ''}; its columns are {have}: map it with "
                f"data.columns: {{{name}: {close or '<column>'}}}"
            )


def derived_token_limit(agent, policy_config, longest_prompt: int | None) -> str | None:
    """The line a run prints once when ``agent`` was given no ``max_total_tokens``: each episode's row then holds up to the
    policy's context less its prompt. None when it was given; a `ConfigError` when the policy's config gives no context."""
    if agent is None or agent.max_total_tokens is not None:
        return None
    positions = context_length(policy_config)
    if positions is None:
        raise ConfigError(
            f"model.agent ({type(agent).__name__}): max_total_tokens is not set and the policy's config gives no "
            "max_position_embeddings to derive it from: set model.agent.init_args.max_total_tokens"
        )
    after = (
        f"; {positions - longest_prompt} after the longest prompt ({longest_prompt} tokens)" if longest_prompt else ""
    )
    return (
        f"model.agent.init_args.max_total_tokens is not set: each episode's tokens fill the policy's context "
        f"(max_position_embeddings {positions}) less its prompt{after}. Set it to cap them"
    )
