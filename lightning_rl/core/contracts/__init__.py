"""The contracts: what the loop, the roster and the other layers know of each swappable part. `components/` implements
them; a class of your own subclasses one (e.g. ``class MyReward(Reward)``) and is named in a config by its import path.

=================  ==========================================================================================
contract           the part
=================  ==========================================================================================
`Rollout`          prompts in, a `RolloutBatch` of sampled responses out
`Agent`            whole episodes (several model calls) sampled through a `Rollout`
`Environment`      a multi-turn episode's other side: the model's turn in, an observation, a reward and done out
`Reward`           a batch in, one score per sample out
`AdvantageEstimator`  rewards (and values) in, per-token advantages out
`Surrogate`        log-probs in, an unreduced per-token policy loss out (`Correction`: its sampler/trainer weights)
`KLPenalty`        the divergence from the reference, in the reward or in the loss
`Aggregator`       a per-token loss in, a scalar out
`LossTerm`         an extra per-token term added to the surrogate
`Critic`           a trainable value function
`Teacher`          the teacher's log-probs of the student's sampled tokens (on-policy distillation)
`GroupFilter`      which samples train, and how many rollout rounds refill a batch (DAPO's dynamic sampling)
`PretrainLoss`     a language-modelling loss on text mixed into the policy loss (PPO-ptx)
=================  ==========================================================================================
"""

from .advantage import AdvantageEstimator, Advantages, Whiten
from .agent import Agent
from .aggregator import Aggregator
from .critic import Critic
from .environment import Environment, Step, Turn, checked_step
from .kl import KLPenalty
from .loss_term import LossTerm
from .pretrain import PretrainLoss
from .reward import Reward, RewardInputs, Scores, as_scores, raw_scores
from .rollout import Rollout
from .sampling import GroupFilter
from .surrogate import Correction, Surrogate
from .teacher import Teacher, TeacherScores

__all__ = [
    "AdvantageEstimator",
    "Advantages",
    "Agent",
    "Aggregator",
    "Correction",
    "Critic",
    "Environment",
    "GroupFilter",
    "KLPenalty",
    "LossTerm",
    "PretrainLoss",
    "Reward",
    "RewardInputs",
    "Rollout",
    "Scores",
    "Step",
    "Surrogate",
    "Teacher",
    "TeacherScores",
    "Turn",
    "Whiten",
    "as_scores",
    "checked_step",
    "raw_scores",
]
