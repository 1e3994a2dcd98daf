"""`Composite`: a weighted sum of rewards."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Reward, Scores


class Composite(nn.Module, Reward):
    """R = sum_k w_k R_k: e.g. correctness plus a format bonus plus DAPO's overlong penalty.

    Each part is checked like a top-level reward (B finite scores, errors name the part). ``score`` returns every
    part's unweighted scores by name with the sum: the batch carries them (``score_parts``), the trainer logs them
    as ``reward/<name>`` and `DynamicSampling(part=<name>)` filters on one of them (DAPO filters on accuracy, not on
    the sum).

    The parts that are modules (`Shaped`, `RewardModel`: running statistics, a model) are its submodules (``parts.<i>``,
    i their position), so checkpoints carry their state, train/eval mode reaches them and sharding finds a reward model.
    """

    def __init__(self, rewards: list[Reward], weights: list[float] | None = None, names: list[str] | None = None):
        """
        Args:
            rewards: the reward terms (each a class_path / init_args entry in YAML).
            weights: one weight per term (None = all 1.0).
            names: one name per term, for logging and `DynamicSampling(part=...)` (None = each reward's class name, a
                `FunctionReward`'s function name).
        """
        super().__init__()
        if not rewards:
            raise ValueError("Composite: give at least one reward in `rewards`")
        weights = [1.0] * len(rewards) if weights is None else list(weights)
        if len(weights) != len(rewards):
            raise ValueError(
                f"Composite: {len(rewards)} rewards but {len(weights)} weights; give one weight per reward"
            )
        if names is None:  # class names (a function's name), numbered where one repeats: ExactMatch, ExactMatch_2
            seen: dict[str, int] = {}
            names = []
            for reward in rewards:
                seen[reward.part_name] = seen.get(reward.part_name, 0) + 1
                count = seen[reward.part_name]
                names.append(reward.part_name if count == 1 else f"{reward.part_name}_{count}")
        names = list(names)
        if len(names) != len(rewards) or len(set(names)) != len(names):
            raise ValueError(
                f"Composite: names must be one distinct name per reward, got {names}; give `names` explicitly"
            )
        self.rewards, self.weights, self.names = list(rewards), [float(w) for w in weights], names
        self.parts = nn.ModuleDict({str(i): r for i, r in enumerate(self.rewards) if isinstance(r, nn.Module)})
        self.requires = frozenset().union(*(r.requires for r in self.rewards))

    def data_columns(self) -> frozenset[str]:
        return frozenset().union(*(r.data_columns() for r in self.rewards))

    @property
    def name(self) -> str:
        return "Composite(" + ", ".join(f"{w:g}*{r.name}" for r, w in zip(self.rewards, self.weights)) + ")"

    @property
    def model_path(self) -> str | None:
        """The first part's that scores with a learned reward model."""
        return next((r.model_path for r in self.rewards if r.model_path is not None), None)

    def setup(self, tokenizer) -> None:
        for reward in self.rewards:
            reward.setup(tokenizer)

    def __call__(self, batch: RolloutBatch) -> Tensor:
        return self.score(batch).total

    def score(self, batch: RolloutBatch) -> Scores:
        """Each part's own `score` (its checks, and its ``on_failure`` for rows it cannot score), weighted and summed.
        A fraction two parts both count (``reward/error_frac``) is the larger of the two."""
        total = torch.zeros(batch.batch_size, dtype=torch.float32)
        parts, metrics = {}, {}
        for reward, weight, name in zip(self.rewards, self.weights, self.names):
            scored = reward.score(batch)
            part = scored.total.float().cpu()  # (B,)
            parts[name] = part.detach()
            for key, value in scored.metrics.items():
                metrics[key] = torch.maximum(metrics[key], value) if key.endswith("_frac") and key in metrics else value
            total += weight * part
        return Scores(total.to(batch.response_ids.device), parts, metrics)
