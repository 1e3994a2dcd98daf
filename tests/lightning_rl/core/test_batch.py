import pytest
import torch

from lightning_rl.core.batch import Prompts, RolloutBatch, terminal_rewards


def test_terminal_rewards_sit_on_the_last_valid_token():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    out = terminal_rewards(torch.tensor([2.0, -1.0, 5.0]), mask)
    assert out.tolist() == [[0.0, 0.0, 2.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]


def test_cat_pads_responses_right_and_prompts_left():
    a = RolloutBatch(
        prompt_ids=torch.tensor([[5, 6]]),
        prompt_mask=torch.tensor([[1, 1]]),
        response_ids=torch.tensor([[7]]),
        response_mask=torch.tensor([[1]]),
        scores=torch.tensor([1.0]),
    )
    b = RolloutBatch(
        prompt_ids=torch.tensor([[5, 6, 7]]),
        prompt_mask=torch.tensor([[1, 1, 1]]),
        response_ids=torch.tensor([[8, 9]]),
        response_mask=torch.tensor([[1, 1]]),
        scores=torch.tensor([0.0]),
    )
    c = RolloutBatch.cat([a, b])
    assert c.prompt_ids.tolist() == [[0, 5, 6], [5, 6, 7]]
    assert c.prompt_mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    assert c.response_ids.tolist() == [[7, 0], [8, 9]]
    assert c.response_mask.tolist() == [[1, 0], [1, 1]]
    assert c.scores.tolist() == [1.0, 0.0]


def test_select_split_and_loss_mask():
    batch = RolloutBatch(
        response_ids=torch.zeros(5, 2, dtype=torch.long),
        response_mask=torch.ones(5, 2, dtype=torch.long),
        sample_mask=torch.tensor([1.0, 0, 1, 1, 1]),
    )
    assert [b.batch_size for b in batch.split(2)] == [2, 2, 1]
    assert batch.select(torch.tensor([True, False, True, False, False])).batch_size == 2
    assert batch.loss_mask.sum().item() == 8


def test_terminal_rewards_skip_trailing_environment_tokens():
    action_tokens = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]])
    out = terminal_rewards(torch.tensor([2.0, -1.0, 5.0]), action_tokens)
    assert out.tolist() == [[0.0, 2.0, 0.0, 0.0], [0.0, 0.0, -1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]


def test_action_mask_is_folded_into_the_loss_mask():
    batch = RolloutBatch(
        response_ids=torch.ones(2, 4, dtype=torch.long),
        response_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),
        action_mask=torch.tensor([[1, 0, 1, 1], [0, 1, 1, 1]]),
        sample_mask=torch.tensor([1.0, 0.0]),
    )
    assert batch.action_tokens.tolist() == [[1, 0, 1, 0], [0, 1, 1, 1]]
    assert batch.loss_mask.tolist() == [[1, 0, 1, 0], [0, 0, 0, 0]]
    assert batch.response_lengths.tolist() == [3, 4]  # a decode reads the whole row
    cat = RolloutBatch.cat([batch.select(slice(0, 1)), batch.select(slice(1, 2))])
    assert cat.action_mask.tolist() == batch.action_mask.tolist()


def _rows() -> RolloutBatch:
    return RolloutBatch(
        response_ids=torch.arange(8).reshape(4, 2), response_mask=torch.ones(4, 2, dtype=torch.long), scores=torch.tensor([0.0, 1.0, 2.0, 3.0]),
        columns={"answer": ["a", "b", "c", "d"], "completions": ["w", "x", "y", "z"]}, score_parts={"accuracy": torch.tensor([0.0, 1.0, 1.0, 0.0])},
    )  # fmt: skip


def test_per_row_fields_follow_every_row_selection():
    batch = _rows()
    for index, rows in [
        (torch.tensor([True, False, True, False]), [0, 2]),
        (torch.tensor([3, 1]), [3, 1]),
        (slice(1, 3), [1, 2]),
    ]:
        picked = batch.select(index)
        assert picked.columns == {
            "answer": [list("abcd")[i] for i in rows],
            "completions": [list("wxyz")[i] for i in rows],
        }
        assert picked.score_parts["accuracy"].tolist() == [[0.0, 1.0, 1.0, 0.0][i] for i in rows]
        assert picked.scores.tolist() == [float(i) for i in rows]  # the tensors and the rows stay together
    assert [part.columns["answer"] for part in batch.split(3)] == [["a", "b", "c"], ["d"]]
    joined = RolloutBatch.cat(batch.split(3))
    assert joined.columns == batch.columns and torch.equal(
        joined.score_parts["accuracy"], batch.score_parts["accuracy"]
    )
    with pytest.raises(ValueError, match="different names"):
        RolloutBatch.cat([batch, batch.replace(columns={"answer": list("abcd")})])


def test_with_columns_adds_per_row_values_and_checks_their_count():
    batch = _rows().with_columns(prompts=["1", "2", "3", "4"])
    assert list(batch.columns) == ["answer", "completions", "prompts"]
    with pytest.raises(ValueError, match="column 'prompts' has 3 values for 4 rows"):
        _rows().with_columns(prompts=["1", "2", "3"])


def test_prompts_lay_their_fields_out_over_each_prompts_rows():
    prompts = Prompts(
        torch.tensor([[0, 5], [6, 7]]), torch.tensor([[0, 1], [1, 1]]), {"prompt": ["p", "q"], "answer": ["1", "2"]}
    )
    rows = prompts.per_row(3)
    assert rows["prompt_ids"].tolist() == [[0, 5]] * 3 + [[6, 7]] * 3 and rows["prompt_mask"].shape == (6, 2)
    assert rows["columns"] == {"prompt": ["p"] * 3 + ["q"] * 3, "answer": ["1"] * 3 + ["2"] * 3}
    assert prompts.rows() == [{"prompt": "p", "answer": "1"}, {"prompt": "q", "answer": "2"}] and len(prompts) == 2
