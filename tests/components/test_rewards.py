import pytest
import torch

from components.reward import (
    Composite,
    ExactMatch,
    Format,
    FunctionReward,
    MathVerify,
    MissingEOSPenalty,
    OverlongPenalty,
)
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.errors import RewardError


def _batch(lengths, width=None, truncated=None):
    lengths = torch.as_tensor(lengths)
    width = width or int(lengths.max())
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    truncated = torch.zeros(len(lengths), dtype=torch.bool) if truncated is None else torch.as_tensor(truncated)
    return RolloutBatch(response_ids=mask * 5, response_mask=mask, truncated=truncated)


def test_overlong_penalty_dapo_numbers():
    # DAPO (eq. 13): L_max = 20480, L_cache = 4096; 0 up to 16384 tokens, then a linear ramp to -1 at 20480
    penalty = OverlongPenalty(max_length=20480, buffer=4096)
    scores = penalty(_batch([100, 16384, 17408, 18432, 20480, 20480]))
    torch.testing.assert_close(scores, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))


def test_overlong_penalty_scale_and_beyond_the_cap():
    scores = OverlongPenalty(max_length=8, buffer=4, penalty=0.5)(_batch([4, 5, 8, 10]))
    torch.testing.assert_close(scores, torch.tensor([0.0, -0.125, -0.5, -0.5]))
    with pytest.raises(ValueError, match="buffer"):
        OverlongPenalty(max_length=8, buffer=9)


def test_composite_is_the_weighted_sum_and_names_its_parts():
    meta = {"completions": ["<a>12</a>", "13", "12"], "answer": ["12", "12", "12"]}
    batch = _batch([9, 2, 2])
    composite = Composite(
        [
            ExactMatch(extract=r"<a>(.*)</a>"),
            Format(pattern=r"<a>.*</a>", bonus=1.0),
            OverlongPenalty(max_length=4, buffer=2),
        ],
        weights=[1.0, 0.2, 2.0],
    )
    # sample 0: match 1 + format 0.2 * 1 + 2 * (-1) (9 tokens > 4); sample 1: extract fails -> 0; sample 2: same
    torch.testing.assert_close(composite(batch.replace(columns=meta)), torch.tensor([1.0 + 0.2 - 2.0, 0.0, 0.0]))
    assert composite.requires == frozenset({"response_mask"})
    assert "0.2*Format" in composite.name
    unweighted = Composite([ExactMatch(), ExactMatch()])
    torch.testing.assert_close(unweighted(batch.replace(columns=meta)), torch.tensor([0.0, 0.0, 2.0]))
    assert unweighted.names == ["ExactMatch", "ExactMatch_2"]


def completion_length(completions, **_):
    return [float(len(text)) for text in completions]


def test_a_functions_part_is_named_by_the_function_so_its_tag_reads_as_one_word():
    # reward/<part>: the dotted path (tests.components.test_rewards.completion_length) would read as folders
    composite = Composite([FunctionReward(completion_length), MissingEOSPenalty(FunctionReward(completion_length))])
    assert composite.names == ["completion_length", "completion_length_2"]
    parts = composite.score(_batch([2, 1]).replace(columns={"completions": ["ab", "c"]})).parts
    torch.testing.assert_close(parts["completion_length"], torch.tensor([2.0, 1.0]))


def test_composite_errors_name_the_culprit():
    with pytest.raises(ValueError, match="one weight per reward"):
        Composite([ExactMatch()], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="at least one"):
        Composite([])
    bad = Composite([ExactMatch(), FunctionReward(fn=lambda completions, **_: [float("nan")] * len(completions))])
    with pytest.raises(RewardError, match=r"reward FunctionReward\(.*<lambda>\) failed at row 0 of 1 .*returned nan"):
        bad(_batch([1]).replace(columns={"completions": ["1"], "answer": ["1"]}))


def test_composite_and_missing_eos_pass_setup_on():
    seen = []

    class Probe(ExactMatch):
        def setup(self, tokenizer):
            seen.append(tokenizer)

    Composite([Probe(), MissingEOSPenalty(Probe())]).setup("tok")
    assert seen == ["tok", "tok"]


def test_format_bonus():
    meta = {
        "completions": ["<think>a\nb</think> <answer>3</answer>", "<answer>3</answer>", " <answer>3</answer> trailing"]
    }
    fmt = Format(pattern=r"<think>.*</think>\s*<answer>.*</answer>", bonus=0.5, miss=-0.1)
    torch.testing.assert_close(fmt(_batch([1, 1, 1]).replace(columns=meta)), torch.tensor([0.5, -0.1, -0.1]))
    full = Format(pattern=r"<answer>\d+</answer>", full_match=True)
    torch.testing.assert_close(full(_batch([1, 1, 1]).replace(columns=meta)), torch.tensor([0.0, 0.1, 0.0]))
    with pytest.raises(ValueError, match="not a valid regular expression"):
        Format(pattern="(")


def test_math_verify_checks_equivalence():
    reward = MathVerify()
    meta = {
        "completions": ["The answer is 82", "81", "$0.5$", "\\boxed{\\frac{1}{2}}", "", "x = 82"],
        "answer": ["82", "82", "\\frac{1}{2}", "0.5", "82", "82"],
    }
    torch.testing.assert_close(
        reward(_batch([1] * 6).replace(columns=meta)), torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    )
    custom = MathVerify(correct=2.0, wrong=-1.0)
    torch.testing.assert_close(
        custom(_batch([1, 1]).replace(columns={"completions": ["4", "5"], "answer": ["4", "4"]})),
        torch.tensor([2.0, -1.0]),
    )


def test_math_verify_errors_name_the_column_and_the_reference():
    with pytest.raises(KeyError, match="gold"):
        MathVerify(answer_key="gold")(_batch([1]).replace(columns={"completions": ["1"], "answer": ["1"]}))
    with pytest.raises(ValueError, match="reference answer"):
        MathVerify()(_batch([1]).replace(columns={"completions": ["1"], "answer": [" "]}))


def test_math_verify_reads_a_bare_reference_as_latex():
    # parsed as plain text, "2\pi" would be 2 and "10^{3}" would be 10
    meta = {"completions": ["$2\\pi$", "2", "1000", "10"], "answer": ["2\\pi", "2\\pi", "10^{3}", "10^{3}"]}
    torch.testing.assert_close(MathVerify()(_batch([1] * 4).replace(columns=meta)), torch.tensor([1.0, 0.0, 1.0, 0.0]))


def test_missing_eos_penalty_replaces_truncated_scores():
    inner = FunctionReward(fn=lambda completions, **_: [1.0, 0.5, 0.25])
    reward = MissingEOSPenalty(inner)
    scores = reward(_batch([1, 2, 3], truncated=[False, True, False]).replace(columns={"completions": ["a", "b", "c"]}))
    torch.testing.assert_close(scores, torch.tensor([1.0, -1.0, 0.25]))
    custom = MissingEOSPenalty(inner, penalty=-3.0)
    torch.testing.assert_close(
        custom(_batch([1, 2, 3], truncated=[True, True, False]).replace(columns={"completions": ["a", "b", "c"]})),
        torch.tensor([-3.0, -3.0, 0.25]),
    )
    assert "truncated" in reward.requires


def test_scores_as_numpy_arrays_numpy_scalars_and_0d_tensors_are_accepted():
    import numpy as np

    from lightning_rl.core.contracts import as_scores

    expected = torch.tensor([1.0, 0.0, 0.5])
    for values in (
        np.array([1.0, 0.0, 0.5]),
        np.array([[1], [0], [0.5]], dtype=np.float32),
        [np.float32(1), np.int64(0), torch.tensor(0.5)],
        torch.tensor([[1.0], [0.0], [0.5]]),
    ):
        torch.testing.assert_close(as_scores(values, 3, "r"), expected)
    with pytest.raises(
        ValueError, match=r"must return 3 scores \(one per sample\), got a tensor or array of shape \(2,\)"
    ):
        as_scores(np.array([1.0, 2.0]), 3, "r")
    with pytest.raises(ValueError, match="returned nan at sample 1"):
        as_scores(np.array([1.0, np.nan, 0.0]), 3, "r")


def test_a_wrapped_reward_reads_the_columns_its_inner_reward_reads():
    """`MissingEOSPenalty` did not pass on its inner reward's data columns, so a data source without the column the inner
    reward reads was not refused before the models loaded; both wrappers now take them from the reward they wrap."""
    from components.reward import ExactMatch, MissingEOSPenalty, Shaped

    inner = ExactMatch(answer_key="solution")
    for wrapper in (MissingEOSPenalty(inner), Shaped(inner), MissingEOSPenalty(Shaped(inner))):
        assert wrapper.data_columns() == frozenset({"solution"}), wrapper.name
    assert MissingEOSPenalty(Shaped(inner)).name == "MissingEOSPenalty(Shaped(ExactMatch))"
