"""Every teacher-server answer checked before the loss (components.teacher.answers): NaN, +inf and positive log-probs,
top-k lists with a duplicated id, an id past the vocabulary, or probabilities summing past 1 fail naming the server;
what a model does give passes."""

from __future__ import annotations

import math

import pytest

from components.rollout.server.samples import Scored
from components.rollout.sglang import SGLangError
from components.teacher.answers import check_scored, scored_problem

GOOD = Scored([-0.2, -1.5], "3", [[4, 7], [1, 2]], [[-0.2, -2.0], [-0.3, -1.5]])


def test_what_a_model_gives_passes():
    assert scored_problem(GOOD, 2, 2, 18) is None
    assert scored_problem(Scored([-0.0, -1e-7 + 1e-7], None), 2, 0, 18) is None  # log_softmax rounds to 0
    assert (
        scored_problem(Scored([-0.1, -30.0], None, [[4, 7], [1, 2]], [[-0.1, -2.4], [-math.log(2)] * 2]), 2, 2, 18)
        is None
    )


@pytest.mark.parametrize(
    "scored, problem",
    [
        (GOOD._replace(logprobs=[math.nan, -1.5]), "log-prob nan for the given token at position 0"),
        (GOOD._replace(logprobs=[-0.2, math.inf]), "log-prob inf for the given token at position 1"),
        (GOOD._replace(logprobs=[0.4, -1.5]), "log-prob 0.4 for the given token at position 0"),
        (GOOD._replace(logprobs=[-0.2]), "1 log-probs for 2 given tokens"),
        (GOOD._replace(top_ids=[[4, 4], [1, 2]]), "token id 4 twice in the top 2 at position 0 ([4, 4])"),
        (
            GOOD._replace(top_ids=[[4, 7], [1, 18]]),
            "top-k token id 18 at position 1, outside the policy's vocabulary (0..17)",
        ),
        (GOOD._replace(top_ids=[[-1, 7], [1, 2]]), "top-k token id -1 at position 0"),
        (GOOD._replace(top_logprobs=[[-0.2, math.nan], [-0.3, -1.5]]), "top-2 log-probs [-0.2, nan] at position 0"),
        (GOOD._replace(top_logprobs=[[-0.2, -2.0], [-0.1, -0.2]]), "at position 1, whose probabilities sum past 1"),
        (GOOD._replace(top_ids=[[4], [1, 2]]), "1 top ids and 2 log-probs at position 0 for top_k=2"),
    ],
)
def test_an_answer_no_model_gives_fails_naming_the_server(scored, problem):
    with pytest.raises(SGLangError) as err:
        check_scored(SGLangError, "http://t:1", "model.teacher.init_args", scored, 2, 2, 18)
    message = str(err.value)
    assert message.startswith(
        "SGLang server at http://t:1 (model.teacher.init_args) answered scores no teacher can give: "
    )
    assert problem in message and "\n" not in message
