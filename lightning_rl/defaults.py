"""The parts a run gets where its config names none: GRPO's, on the in-process sampler with an exact-match reward.

The loop knows parts only by their contracts (lightning_rl.core.contracts); this module is the one place it takes
concrete ones from: lazy instances (built when first used, so a config that replaces one never builds it), and the
implementation of each optional part that is off by default (`KL`, `CRITIC`, `SAMPLING`, `PTX`). Those four are the
types of their slots, so that ``--model.kl.init_args.coef=0.05`` turns one on without naming a class_path (a
subclass of it plugs in as any component does).
"""

from __future__ import annotations

from jsonargparse import lazy_instance

from components.advantage import GroupNormalized
from components.aggregator import TokenMean
from components.critic import ValueCritic
from components.dynamic_sampling import DynamicSampling
from components.kl import KLRegularizer
from components.ptx import PretrainMix
from components.reward import ExactMatch
from components.rollout import HFRollout
from components.surrogate import ClippedSurrogate

ROLLOUT = lazy_instance(HFRollout, group_size=8, max_new_tokens=8, temperature=1.0)
REWARD = lazy_instance(ExactMatch)
ADVANTAGE = lazy_instance(GroupNormalized)
SURROGATE = lazy_instance(ClippedSurrogate, eps_low=0.2, eps_high=0.2)
AGGREGATOR = lazy_instance(TokenMean)

KL = KLRegularizer
CRITIC = ValueCritic
SAMPLING = DynamicSampling
PTX = PretrainMix
